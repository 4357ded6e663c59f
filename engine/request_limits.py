"""The accepted range of every request parameter, in one table.

``SamplingParams.validate`` (the in-process API) and the server's request schemas
(``engine/server/protocol.py``) both check these, and docs/server.md lists them. Every bound keeps a
value representable where it ends up (an int64 tensor, a float32 divisor, a torch generator seed), so
no request can reach a step that one of its values would make raise.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Below this a temperature is greedy (as in vLLM): logits / 1e-40 overflow float32 to inf, and NaN.
GREEDY_TEMPERATURE = 1e-5


class InvalidParam(ValueError):
    """A request parameter outside its range; ``param`` names it, ``code`` is the server's error code."""

    def __init__(self, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class Range:
    """A closed interval (``low_open``: open at ``low``) of integers or of finite real numbers."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False

    def __contains__(self, value: object) -> bool:
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high  # NaN fails both comparisons

    def describe(self) -> str:
        if self.low == self.high:
            return _bound(self.low)
        kind = "an integer" if self.integer else "a number"
        return f"{kind} in {'(' if self.low_open else '['}{_bound(self.low)}, {_bound(self.high)}]"

    def check(self, name: str, value: object) -> None:
        """Raise InvalidParam naming ``name`` if ``value`` is outside the range (or of the wrong type)."""
        if value not in self:
            raise InvalidParam(name, f"{name} must be {self.describe()}, got {short_repr(value)}")


@dataclass(frozen=True)
class Size:
    """A bound on how many items (or characters) a field may hold."""

    max_items: int
    what: str = "items"

    def describe(self) -> str:
        return f"at most {self.max_items:,} {self.what}"


RANGES: dict[str, Range] = {
    "max_tokens": Range(1, INT64_MAX, integer=True),  # the context window bounds it further
    "temperature": Range(0, 2),  # < GREEDY_TEMPERATURE: greedy
    "top_p": Range(0, 1, low_open=True),
    "top_k": Range(-1, INT64_MAX, integer=True),  # -1 or 0: off; >= the vocabulary: off
    "seed": Range(INT64_MIN, 2**64 - 1, integer=True),  # what torch.Generator.manual_seed takes
    "stop_token_ids": Range(0, INT64_MAX, integer=True),  # each id
    "n": Range(1, 1, integer=True),
    "logprobs": Range(0, 20, integer=True),  # top-k per token (vLLM's cap); also prompt_logprobs; chat: top_logprobs
    "top_logprobs": Range(0, 20, integer=True),
    # Accepted by the server only at their defaults (see NOT_SUPPORTED in engine/server/protocol.py).
    "min_p": Range(0, 1),
    "presence_penalty": Range(-2, 2),
    "frequency_penalty": Range(-2, 2),
    "repetition_penalty": Range(0, 2, low_open=True),
    "logit_bias": Range(-100, 100),  # each bias; keys are token ids
}

SIZES: dict[str, Size] = {
    "prompt": Size(256, "prompts per request"),
    "stop": Size(16, "strings"),
    "stop_string": Size(256, "characters each"),  # the per-token stop-string check is quadratic in this
    "stop_token_ids": Size(64, "ids"),
    "logit_bias": Size(300, "entries"),
    "x-request-id": Size(128, "printable ASCII characters"),
}


def check_prompt_ids(token_ids: list[int], vocab_size: int) -> None:
    """Raise InvalidParam ("prompt") unless the prompt is a non-empty list of token ids in the vocabulary.
    The server checks a request with it before submitting, and ``LLMEngine.add_request`` again."""
    if not token_ids:
        raise InvalidParam("prompt", "prompt is empty", code="empty_prompt")
    bad = [t for t in token_ids if type(t) is not int or not 0 <= t < vocab_size]
    if bad:
        raise InvalidParam("prompt", f"prompt: token ids must be integers in [0, {vocab_size}) (this model's "
                           f"vocabulary), got {short_repr(bad[0])}")


def check_context_length(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """Raise InvalidParam ("max_tokens") unless the prompt plus ``max_tokens`` (None: at least one token)
    fit in ``max_model_len``. The server checks a request with it, ``LLMEngine.add_request`` again (with
    None: the engine cuts max_tokens to the context window)."""
    budget = max_model_len - num_prompt_tokens
    if budget < 1 or (max_tokens is not None and max_tokens > budget):
        asked = f"{num_prompt_tokens} in the prompt" + (f" + {max_tokens} to generate" if max_tokens else "")
        raise InvalidParam("max_tokens", f"this model's maximum context length (max_model_len) is {max_model_len} "
                           f"tokens; the request needs {asked} (at least one must be generated)",
                           code="context_length_exceeded")


def short_repr(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters; a huge integer by its size (Python refuses to print
    one of more than 4,300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _bound(x: float) -> str:
    if x == INT64_MAX:
        return "2^63-1"
    if x == INT64_MIN:
        return "-2^63"
    if x == 2**64 - 1:
        return "2^64-1"
    return f"{x:g}"


def check_kv_budget(num_tokens: int, kv: Any, on_gpu: bool) -> None:
    """ValueError, naming the knob to raise, unless a request of up to ``num_tokens`` fits ``kv``'s cache (a
    KVCacheManager, less its watermark) alone."""
    needed, total_blocks = -(-num_tokens // kv.block_size), kv.num_blocks
    if needed > total_blocks - kv.watermark_blocks:
        budget = ("cache.gpu_memory_utilization (LLM(gpu_memory_utilization=...))" if on_gpu
                  else "cache.kv_memory_gib (LLM(kv_memory_gib=...))")
        raise ValueError(f"request needs {needed} KV blocks but the cache has {total_blocks}; "
                         f"raise {budget} or lower max_tokens")
