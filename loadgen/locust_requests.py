"""One streamed completion sent by a Locust user (loadgen/locustfile.py), and the Locust statistics
it reports. Imported only inside a Locust process (Locust monkeypatches with gevent on import)."""
from __future__ import annotations

import time

import gevent
import numpy as np
from gevent import GreenletExit
from locust.contrib.fasthttp import FastHttpSession
from locust.env import Environment

from loadgen.completions import (
    CANCELLED,
    NO_DONE,
    ResponseError,
    apply_sse_event,
    failure_error,
    request,
    timeout_error,
)
from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

REQUEST_TYPE = "LLM"
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def _read_stream(response, record: RequestRecord) -> None:
    """Apply the SSE events of a streaming response to the record as they arrive; raise on failure."""
    if response.status_code != 200:
        if not response.status_code:  # no HTTP response: the connection failed or timed out
            raise getattr(response.error, "original", None) or response.error  # unwrap RetriesExceeded
        raise ResponseError(f"HTTP {response.status_code}: {(response.text or '')[:500]}")
    body = response._response  # geventhttpclient's: readline returns each line as soon as it is in
    while line := body.readline(b"\n"):
        if line.startswith(b"data:"):
            apply_sse_event(line[5:].strip(), time.time(), record)
    if record.status != "ok":
        raise ResponseError(NO_DONE)


def stream_completion(client: FastHttpSession, spec: RequestSpec, *, model: str, intended_send_time: float,
                      timeout_s: float, endpoint: str = "completions") -> tuple[RequestRecord, bool]:
    """POST one streaming completion (``endpoint``: completions or chat) now and read it to the end: its
    record (statuses as in loadgen.client.send_request) and whether the greenlet was killed meanwhile."""
    record = RequestRecord.unsent(spec, intended_send_time=intended_send_time, is_warmup=False)
    record.mark_sent(time.time())
    status, error, killed, response = "ok", None, False, None
    path, body = request(spec, model, endpoint)
    deadline = gevent.Timeout(timeout_s)
    deadline.start()
    try:
        # catch_response without a with-block: Locust reports nothing for the request itself (its own
        # timing would end at the response headers); report() fires "E2E" for the whole stream
        response = client.post(path, data=body, headers=HEADERS,
                               stream=True, catch_response=True)
        _read_stream(response, record)
    except gevent.Timeout as e:
        if e is not deadline:
            raise
        status, error = "timeout", timeout_error(timeout_s)
    except GreenletExit:
        status, error, killed = "aborted", CANCELLED, True
    except Exception as e:  # connection and protocol failures: every failure must become a record
        status, error = "error", failure_error(e)
    finally:
        deadline.close()
        if getattr(response, "_response", None) is not None:  # None: no HTTP response at all
            response._response.release()  # an unfinished stream closes its connection (the server aborts it)
    record.end(status, error, time.time())
    return record, killed


def fire(environment: Environment, name: str, value: float, exception: Exception | None = None) -> None:
    environment.events.request.fire(request_type=REQUEST_TYPE, name=name, response_time=value,
                                    response_length=0, exception=exception, context={})


def report(environment: Environment, record: RequestRecord) -> None:
    """The Locust events of one sent request: E2E always; TTFT, each TBT and output_tokens when ok."""
    ok = record.status == "ok"
    fire(environment, "E2E", (record.finish_time - record.intended_send_time) * 1e3,
         None if ok else ResponseError(f"{record.status}: {record.error}"))
    if ok and record.token_times:
        fire(environment, "TTFT", (record.first_token_time - record.intended_send_time) * 1e3)
        for gap in np.diff(record.token_times) * 1e3:
            fire(environment, "TBT", float(gap))
        fire(environment, "output_tokens", record.output_tokens)
