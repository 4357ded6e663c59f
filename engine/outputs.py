"""What the engine reports per request (its BatchRecord per iteration is on the records floor, engine/records)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallfree.engine.request import Request, RequestMetrics, TokenLogprob


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


def request_output(request: Request, new_tokens: list[int], tokenizer: Any, error: str | None = None
                   ) -> RequestOutput:
    """The request's output after a step that emitted ``new_tokens``."""
    finished = request.status.finished
    return RequestOutput(
        request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
        token_ids=list(request.output_token_ids), new_token_ids=new_tokens,
        # Decoding the whole output every step is quadratic: only finished outputs carry text.
        text=tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        if finished and tokenizer is not None else "",
        finished=finished, finish_reason=request.status.value if finished else None,
        metrics=request.metrics, error=error,
        logprobs=None if request.logprobs is None else list(request.logprobs),
        prompt_logprobs=request.prompt_logprobs)
