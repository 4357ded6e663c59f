"""One streamed completion sent by a Locust user (loadgen/locust/locustfile.py), and the one Locust request
event it reports: E2E as the response time, under the endpoint's name. Its tokens go to the LLM tab as
they arrive (loadgen.locust.llm_events). Imported only inside a Locust process (Locust monkeypatches
with gevent on import)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import gevent
from gevent import GreenletExit
from locust.contrib.fasthttp import FastHttpSession
from locust.env import Environment

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.locust.llm_events import LiveEvents
from stallfree.loadgen.openai_client.completions import (
    CANCELLED_AT_STOP,
    NO_DONE,
    ResponseError,
    apply_sse_event,
    failure_error,
    request,
    timeout_error,
)

REQUEST_TYPE = "LLM"
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


@dataclass
class StreamResult:
    record: RequestRecord
    body_bytes: int  # of the response body read
    killed: bool  # the greenlet was killed meanwhile


def _read_stream(response, record: RequestRecord, live: LiveEvents) -> int:
    """Apply the SSE events of a streaming response to the record as they arrive, and its new tokens to
    ``live``; return the body's size. Raise on failure."""
    if response.status_code != 200:
        if not response.status_code:  # no HTTP response: the connection failed or timed out
            raise getattr(response.error, "original", None) or response.error  # unwrap RetriesExceeded
        raise ResponseError(f"HTTP {response.status_code}: {(response.text or '')[:500]}")
    body = response._response  # geventhttpclient's: readline returns each line as soon as it is in
    body_bytes = 0
    while line := body.readline(b"\n"):
        body_bytes += len(line)
        if line.startswith(b"data:"):
            received = len(record.token_times)
            apply_sse_event(line[5:].strip(), time.time(), record)
            live.tokens(record, received)
    if record.status != "ok":
        raise ResponseError(NO_DONE)
    return body_bytes


def stream_completion(client: FastHttpSession, spec: RequestSpec, live: LiveEvents, *, model: str,
                      intended_send_time: float, timeout_s: float, endpoint: str = "completions",
                      ignore_eos: bool = True) -> StreamResult:
    """POST one streaming completion (``endpoint``: completions or chat) now and read it to the end
    (statuses as in loadgen.openai_client.client.send_request); ``live`` sees it sent and its tokens arrive."""
    record = RequestRecord.unsent(spec, intended_send_time=intended_send_time, is_warmup=False)
    record.mark_sent(time.time())
    live.sent()
    status, error, killed, response, body_bytes = "ok", None, False, None, 0
    path, body = request(spec, model, endpoint, ignore_eos)
    deadline = gevent.Timeout(timeout_s)
    deadline.start()
    try:
        # catch_response without a with-block: Locust reports nothing for the request itself (its own
        # timing would end at the response headers); report() fires it for the whole stream
        response = client.post(path, data=body, headers=HEADERS,
                               stream=True, catch_response=True)
        body_bytes = _read_stream(response, record, live)
    except gevent.Timeout as e:
        if e is not deadline:
            raise
        status, error = "timeout", timeout_error(timeout_s)
    except GreenletExit:
        status, error, killed = "aborted", CANCELLED_AT_STOP, True
    except Exception as e:  # connection and protocol failures: every failure must become a record
        status, error = "error", failure_error(e)
    finally:
        deadline.close()
        if getattr(response, "_response", None) is not None:  # None: no HTTP response at all
            response._response.release()  # an unfinished stream closes its connection (the server aborts it)
    record.end(status, error, time.time())
    return StreamResult(record, body_bytes, killed)


def fire(environment: Environment, name: str, value: float, exception: Exception | None = None,
         response_length: int = 0) -> None:
    environment.events.request.fire(request_type=REQUEST_TYPE, name=name, response_time=value,
                                    response_length=response_length, exception=exception, context={})


def report(environment: Environment, name: str, result: StreamResult) -> None:
    """The Locust request event of one sent request: its E2E (from the intended send time) as the response
    time, its body size as the response length; a failure unless it ended ok. A request the test's stop
    cut off (-t, Stop) is no request event at all: it is neither a response time nor a failure, and the
    LLM statistics count it as "cancelled at stop"."""
    record = result.record
    if result.killed:
        return
    error = None if record.status == "ok" else ResponseError(f"{record.status}: {record.error}")
    fire(environment, name, (record.finish_time - record.intended_send_time) * 1e3, error, result.body_bytes)
