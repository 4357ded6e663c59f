"""The streamed OpenAI completion as the load generator speaks it, shared by the asyncio client
(loadgen.client) and the Locust users (loadgen.locust_requests): the request body, the SSE events that
fill a RequestRecord, and the failure messages of a request that did not complete.
"""
from __future__ import annotations

import json

from loadgen.records import RequestRecord
from loadgen.workload import RequestSpec

COMPLETIONS_PATH = "/v1/completions"
# server-side timing extension of the final chunk ("stallfree": {...}) -> record fields
SERVER_FIELDS = {"arrival_time": "server_arrival_time", "first_scheduled_time": "server_first_scheduled_time",
                 "finish_time": "server_finish_time", "token_times": "server_token_times",
                 "num_preemptions": "num_preemptions"}
CANCELLED = "cancelled while in flight"
NO_DONE = "stream ended without data: [DONE]"


class ResponseError(Exception):
    """The server answered, but not with a complete successful stream."""


def completion_body(spec: RequestSpec, model: str) -> bytes:
    """A greedy streaming completion of the spec's prompt token ids (``model`` empty: left out)."""
    body = {"prompt": spec.prompt_token_ids, "max_tokens": spec.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    return json.dumps({"model": model, **body} if model else body).encode()


def tokens_in_chunk(chunk: dict) -> int:
    """Tokens carried by one stream chunk: its token_ids / logprobs.tokens when present, otherwise
    one per chunk with a choice, except an empty-text chunk that only carries a finish_reason."""
    if not chunk.get("choices"):
        return 0
    choice = chunk["choices"][0]
    if choice.get("token_ids") is not None:
        return len(choice["token_ids"])
    if (choice.get("logprobs") or {}).get("tokens") is not None:
        return len(choice["logprobs"]["tokens"])
    return int(bool(choice.get("text")) or choice.get("finish_reason") is None)


def apply_sse_event(data: bytes, received: float, record: RequestRecord) -> None:
    """Apply one SSE ``data:`` payload, received at ``received``, to the record: ``[DONE]`` makes it ok."""
    if data == b"[DONE]":
        record.status = "ok"
        return
    chunk = json.loads(data)
    if "error" in chunk:
        raise ResponseError(f"server error in stream: {chunk['error']}")
    record.token_times.extend([received] * tokens_in_chunk(chunk))
    if (chunk.get("usage") or {}).get("completion_tokens") is not None:
        record.output_tokens = chunk["usage"]["completion_tokens"]
    for key, value in (chunk.get("stallfree") or {}).items():
        if key in SERVER_FIELDS:
            setattr(record, SERVER_FIELDS[key], value)


def timeout_error(timeout_s: float) -> str:
    return f"no complete response within {timeout_s} s"


def failure_error(e: Exception) -> str:
    """The error of a request that failed with ``e``: a ResponseError's own message, else the type too."""
    return str(e) if isinstance(e, ResponseError) else f"{type(e).__name__}: {e}"
