"""The streamed OpenAI completion or chat completion as the load generator speaks it, shared by the
asyncio client (loadgen.openai_client.client) and the Locust users (loadgen.locust.user_request): the request body, the
SSE events that fill a RequestRecord, and the failure messages of a request that did not complete.
"""
from __future__ import annotations

import json

from stallfree.engine.records import RequestRecord, RequestSpec

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# server-side timing extension of the final chunk ("stallfree": {...}) -> record fields
SERVER_FIELDS = {"arrival_time": "server_arrival_time", "first_scheduled_time": "server_first_scheduled_time",
                 "finish_time": "server_finish_time", "token_times": "server_token_times",
                 "num_preemptions": "num_preemptions", "kv_transfer_bytes": "kv_transfer_bytes",
                 "kv_transfer_start": "kv_transfer_start", "kv_transfer_end": "kv_transfer_end"}
CANCELLED = "cancelled while in flight"
CANCELLED_AT_STOP = "cancelled at stop"  # a Locust test stopped (-t, Stop) with the request in flight
NO_DONE = "stream ended without data: [DONE]"
# failure_error's prefixes of a server that went away (refused, dropped or cut a connection) instead of answering
CONNECTION_FAILURES = ("ConnectionRefusedError", "ConnectionResetError", "ConnectionAbortedError", "ConnectionError",
                       "BrokenPipeError", "IncompleteReadError")


class ResponseError(Exception):
    """The server answered, but not with a complete successful stream."""


def request(spec: RequestSpec, model: str, endpoint: str = "completions",
            ignore_eos: bool = True) -> tuple[str, bytes]:
    """The path and body of a greedy streaming request (``model`` empty: left out). ``chat`` sends the
    spec's messages, or its text prompt as one user message; ``completions`` its text prompt when it has
    one, else its token ids. A spec without text (the warm-ups, the decode probe) always goes to
    completions: chat needs text. ``ignore_eos``: vLLM's extension that runs every request to max_tokens,
    left out for a server that does not take it (loadgen.targets.server_check.probe_request_shape)."""
    if endpoint == "chat" and (spec.messages is not None or spec.prompt is not None):
        prompt = {"messages": spec.messages or [{"role": "user", "content": spec.prompt}]}
    else:
        endpoint = "completions"
        prompt = {"prompt": spec.prompt if spec.prompt is not None else spec.prompt_token_ids}
    body = {**prompt, "max_tokens": spec.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}} | ({"ignore_eos": True} if ignore_eos else {})
    return ENDPOINT_PATHS[endpoint], json.dumps({"model": model, **body} if model else body).encode()


def tokens_in_chunk(chunk: dict) -> int:
    """Tokens carried by one stream chunk: its token_ids / logprobs.tokens when present, otherwise
    one per chunk with a choice, except an empty-text chunk (text, or a chat delta's content) that only
    carries a finish_reason or the chat role."""
    if not chunk.get("choices"):
        return 0
    choice = chunk["choices"][0]
    if choice.get("token_ids") is not None:
        return len(choice["token_ids"])
    if (choice.get("logprobs") or {}).get("tokens") is not None:
        return len(choice["logprobs"]["tokens"])
    text = choice.get("text") or (choice.get("delta") or {}).get("content")
    if "delta" in choice:  # chat: the first chunk may carry only the role
        return int(bool(text))
    return int(bool(text) or choice.get("finish_reason") is None)


def apply_sse_event(data: bytes, received: float, record: RequestRecord) -> None:
    """Apply one SSE ``data:`` payload, received at ``received``, to the record: ``[DONE]`` makes it ok."""
    if data == b"[DONE]":
        record.status = "ok"
        return
    chunk = json.loads(data)
    if "error" in chunk:
        raise ResponseError(f"server error in stream: {chunk['error']}")
    record.token_times.extend([received] * tokens_in_chunk(chunk))
    usage = chunk.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        record.output_tokens = usage["completion_tokens"]
    if usage.get("prompt_tokens") is not None:  # the server's count of a text prompt's tokens
        record.prompt_tokens = usage["prompt_tokens"]
    if (usage.get("prompt_tokens_details") or {}).get("cached_tokens") is not None:  # OpenAI's and vLLM's field
        record.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
    for key, value in (chunk.get("stallfree") or {}).items():
        if key in SERVER_FIELDS:
            setattr(record, SERVER_FIELDS[key], value)


def timeout_error(timeout_s: float) -> str:
    return f"no complete response within {timeout_s} s"


def failure_error(e: Exception) -> str:
    """The error of a request that failed with ``e``: a ResponseError's own message, else the type too."""
    return str(e) if isinstance(e, ResponseError) else f"{type(e).__name__}: {e}"


def lost_connection(error: str | None) -> bool:
    """Whether a failed request's error says the server went away rather than answered."""
    return error is not None and (error.split(":")[0] in CONNECTION_FAILURES or error == NO_DONE)
