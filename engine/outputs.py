"""What the engine reports per request (its BatchRecord per iteration is on the records floor, engine/records)."""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.request import RequestMetrics, TokenLogprob


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    new_token_ids: list[int]  # the tokens emitted by this step
    text: str  # the decoded output, filled when the request finishes (streamers decode new_token_ids)
    finished: bool
    finish_reason: str | None  # stop | length | abort | error
    metrics: RequestMetrics  # the request's timings so far
    error: str | None = None  # finish_reason "error": what its step raised (the other requests carried on)
    logprobs: list[TokenLogprob] | None = None  # one per entry of token_ids (SamplingParams.logprobs set)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token, the first None
