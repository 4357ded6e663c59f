"""One HTTP request's generation: engine outputs in, one TokenEvent per generated token out."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from stallfree.engine import RequestMetrics, RequestOutput, SamplingParams, TokenLogprob
from stallfree.engine.request_limits import InvalidParam
from stallfree.engine.server.commands import EngineDead, EngineFailed, QueueFull, Submission
from stallfree.engine.server.logprobs_format import Entry
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.protocol import APIError
from stallfree.engine.server.text import ChoiceText

RETRY_AFTER_S = 1


@dataclass
class TokenEvent:
    index: int  # which prompt / choice
    token_id: int
    text: str  # text completed by this token (may be empty)
    finish_reason: str | None = None  # set on the choice's last token
    timings: dict | None = None  # server-side timings, with finish_reason
    logprob: TokenLogprob | None = None  # the request asked for logprobs
    prompt: list[Entry] | None = None  # on the choice's first token, when it asked for prompt logprobs


@dataclass
class _Choice:
    request_id: str
    text: ChoiceText
    num_prompt_tokens: int
    num_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache (known once it is scheduled)
    done: bool = False
    timings: dict | None = None  # once finished


def server_timings(m: RequestMetrics, num_tokens: int, finish_time: float | None) -> dict:
    """The "stallfree" extension field: RequestMetrics of the first ``num_tokens`` tokens (and a disaggregated
    deployment's KV transfer)."""
    timings = {"arrival_time": m.arrival_time, "first_scheduled_time": m.first_scheduled_time,
               "first_token_time": m.first_token_time, "token_times": list(m.token_times[:num_tokens]),
               "finish_time": finish_time, "num_preemptions": m.num_preemptions}
    if m.kv_transfer_bytes is not None:
        timings |= {"kv_transfer_bytes": m.kv_transfer_bytes, "kv_transfer_start": m.kv_transfer_start,
                    "kv_transfer_end": m.kv_transfer_end}
    return timings


def api_error(exc: Exception) -> APIError:
    """The HTTP error of a failed submission or generation."""
    if isinstance(exc, QueueFull):
        return APIError(429, f"{exc}; retry later", type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, EngineDead):
        return APIError(503, str(exc), type="server_error", code="engine_unavailable")
    if isinstance(exc, EngineFailed):
        return APIError(500, str(exc), type="server_error", code="engine_error")
    if isinstance(exc, InvalidParam):
        return APIError(400, str(exc), param=exc.param, code=exc.code)
    return APIError(400, str(exc), code="invalid_value")


@dataclass
class Generation:
    engine_loop: EngineLoop
    submission: Submission
    choices: list[_Choice] = field(default_factory=list)

    @classmethod
    async def start(cls, engine_loop: EngineLoop, tokenizer, prompts: list[list[int]],
                    params: list[SamplingParams], stop: list[str], request_id: str,
                    arrival_time: float) -> Generation:
        """Submit to the engine; raises APIError (429, 400, 503) if it does not take the request."""
        try:
            sub = await engine_loop.submit(prompts, params, request_id, arrival_time)
        except (QueueFull, EngineDead, ValueError) as exc:
            raise api_error(exc) from None
        choices = [_Choice(rid, ChoiceText(tokenizer, p, stop), len(p))
                   for rid, p in zip(sub.request_ids, prompts, strict=True)]
        return cls(engine_loop, sub, choices)

    @property
    def usage(self) -> dict:
        prompt = sum(c.num_prompt_tokens for c in self.choices)
        completion = sum(c.num_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(c.num_cached_tokens for c in self.choices)}}

    @property
    def timings(self) -> dict | None:
        """The server-side timings of a single-prompt request once it finished."""
        return self.choices[0].timings

    async def events(self) -> AsyncIterator[TokenEvent]:
        """Token events until every choice finished; raises EngineFailed / EngineDead. Leaving early
        (client gone, cancellation) aborts the unfinished engine requests."""
        try:
            while not all(c.done for c in self.choices):
                item = await self.submission.queue.get()
                if isinstance(item, Exception):
                    raise item
                for index, out in item:
                    for event in self._token_events(self.choices[index], index, out):
                        yield event
        finally:
            self.close()

    def close(self) -> None:
        for choice in self.choices:
            if not choice.done:
                choice.done = True
                self.engine_loop.abort(choice.request_id)

    def _token_events(self, choice: _Choice, index: int, out: RequestOutput) -> list[TokenEvent]:
        events = []
        first_new = len(out.token_ids) - len(out.new_token_ids)
        choice.num_cached_tokens = out.metrics.num_cached_tokens
        for k, token in enumerate(out.new_token_ids):
            if choice.done:  # outputs still in flight after a stop string ended the choice
                break
            choice.num_tokens += 1
            text, stopped = choice.text.push(token)
            ev = TokenEvent(index, token, text, logprob=None if out.logprobs is None else out.logprobs[first_new + k],
                            prompt=list(zip(out.prompt_token_ids, out.prompt_logprobs, strict=True))
                            if out.prompt_logprobs is not None and choice.num_tokens == 1 else None)
            if stopped:
                choice.done = True
                self.engine_loop.abort(choice.request_id, reason="stop")
                choice.timings = server_timings(out.metrics, choice.num_tokens, time.time())
                ev.finish_reason, ev.timings = "stop", choice.timings
            elif out.finished and k == len(out.new_token_ids) - 1:
                choice.done = True
                rest, stopped = choice.text.finish()
                choice.timings = server_timings(out.metrics, choice.num_tokens, out.metrics.finish_time)
                ev.text, ev.finish_reason, ev.timings = text + rest, "stop" if stopped else out.finish_reason, \
                    choice.timings
            events.append(ev)
        return events
