"""Request state (vLLM V1 style: prompt, outputs and a count of computed tokens)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from stallfree.engine.request_limits import GREEDY_TEMPERATURE, RANGES, SIZES, InvalidParam, short_repr


@dataclass
class TokenLogprob:
    """One token's log-probability under the model's raw distribution at its position (vLLM's Logprob)."""

    token_id: int
    logprob: float
    rank: int  # 1 + the number of tokens more likely than it
    top: list[tuple[int, float]]  # the k most likely (token id, logprob), most likely first


@dataclass
class SamplingParams:
    """Per-request sampling knobs; ``validate`` checks each against its range in ``stallfree.engine.request_limits``."""

    max_tokens: int = 16
    temperature: float = 1.0  # below GREEDY_TEMPERATURE: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    # As vLLM's: the log-probability of each sampled token plus the k most likely, from the model's raw
    # logits (before temperature, top-k and top-p); None: not computed (no cost).
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token given its prefix (the first: None)

    def validate(self) -> None:
        """Raise InvalidParam (a ValueError) naming the first field outside its range (engine.request_limits)."""
        for name in ("max_tokens", "temperature", "top_p", "top_k"):
            RANGES[name].check(name, getattr(self, name))
        for name, limit in (("seed", "seed"), ("logprobs", "logprobs"), ("prompt_logprobs", "logprobs")):
            if getattr(self, name) is not None:
                RANGES[limit].check(name, getattr(self, name))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidParam("ignore_eos", f"ignore_eos must be true or false, got {short_repr(self.ignore_eos)}")
        ids, size = self.stop_token_ids, SIZES["stop_token_ids"]
        if not isinstance(ids, list | tuple | set | frozenset) or len(ids) > size.max_items:
            raise InvalidParam("stop_token_ids", f"stop_token_ids must be a list of {size.describe()}, got {short_repr(ids)}")
        for token in ids:
            RANGES["stop_token_ids"].check("stop_token_ids", token)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # its step raised on it (engine.isolation); the others carried on

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass
class RequestMetrics:
    arrival_time: float  # when the engine received the request
    first_scheduled_time: float | None = None  # the start of its first iteration
    first_token_time: float | None = None  # when its first output token was sampled
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled
    finish_time: float | None = None  # when it finished or was aborted
    num_preemptions: int = 0  # times it was preempted (and recomputed)
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache when it was first admitted
    kv_transfer_bytes: int | None = None  # its prompt's KV from the prefill instance (parallel.disaggregation)
    kv_transfer_start: float | None = None  # when the decode instance began to receive it
    kv_transfer_end: float | None = None  # when it had all of it


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float, max_model_len: int):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.output_token_ids: list[int] = []
        # Filled only when the params ask: one entry per output token; per prompt token (the first None).
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = \
            [None] if params.prompt_logprobs is not None else None
        self.num_tokens = len(self.prompt_token_ids)  # prompt + output; kept by append_output (read every step)
        self.num_computed_tokens = 0
        # The prefix cache's keys of its leading full blocks (engine/prefix_cache.py), made as they are needed.
        self.block_keys: list[tuple[int | None, tuple[int, ...]]] = []
        self.status = RequestStatus.WAITING
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        # Generation stops at max_tokens or when the sequence fills the context window.
        self.max_num_tokens = min(len(prompt_token_ids) + params.max_tokens, max_model_len)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def append_output(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.num_tokens += 1

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without building the whole sequence (a decode needs one)."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt:end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - num_prompt]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """Exactly one token left to compute and the prompt (or its recompute) is done."""
        return self.num_tokens - self.num_computed_tokens == 1 and bool(self.output_token_ids)

    def arrived(self, now: float) -> bool:
        return self.metrics.arrival_time <= now

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, prompt={self.num_prompt_tokens}, out={len(self.output_token_ids)}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")
