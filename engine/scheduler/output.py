"""``SchedulerOutput``: the one thing the scheduler hands a runner each step.

A snapshot: it holds copies of what the runner needs (token ids, positions, block tables, whether to
sample), so a runner never sees the scheduler's requests or the KV-cache manager.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from stallfree.engine.request import SamplingParams


@dataclass(slots=True)
class ScheduledUnit:
    """One request's share of an iteration: a prefill chunk or one decode token. Not changed once built (not
    frozen: a frozen dataclass's ``__init__`` costs twice as much, and one is built per request per step)."""

    request_id: str
    # The tokens this step computes, at positions num_computed_tokens .. num_computed_tokens + len - 1.
    token_ids: list[int]
    # Tokens of this request already in the KV cache (the position of the first new token).
    num_computed_tokens: int
    is_prefill: bool
    # The unit completes the request's known tokens: the runner samples the request's next token.
    samples: bool
    # KV block ids of this request at scheduling time; they hold slots for every token of this step.
    block_table: list[int]
    sampling_params: SamplingParams
    # Requests asking prompt_logprobs: the prompt tokens this step's positions predict, in order (position
    # num_computed_tokens + j predicts token j of these); empty otherwise.
    prompt_logprob_targets: tuple[int, ...] = ()

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    """Built once per step and not changed afterwards (its token counts are computed once, on first use)."""

    # Decodes first, then prefill chunks (the runner's flat token layout).
    units: list[ScheduledUnit] = field(default_factory=list)
    # Requests preempted (by recompute) while building this step; they are back in the waiting queue.
    preempted_request_ids: list[str] = field(default_factory=list)
    # Requests that finished or were aborted since the last step: runners drop per-request state.
    finished_request_ids: list[str] = field(default_factory=list)

    _counts_cache: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def _counts(self) -> tuple[int, ...]:
        """(prefill tokens, decode tokens, prefill seqs, decode seqs, prefill attention work, decode context
        tokens), counted in one pass on first use: the engine and the simulated runners read all six every step."""
        if self._counts_cache is None:
            self._counts_cache = self._count()
        return self._counts_cache

    def _count(self) -> tuple[int, ...]:
        prefill_tokens = decode_tokens = prefill_seqs = work = context = 0
        for u in self.units:
            n = len(u.token_ids)
            if u.is_prefill:
                prefill_tokens += n
                prefill_seqs += 1
                work += n * (u.num_computed_tokens + n)
            else:
                decode_tokens += n
                context += u.num_computed_tokens + 1
        return prefill_tokens, decode_tokens, prefill_seqs, len(self.units) - prefill_seqs, work, context

    @property
    def num_prefill_tokens(self) -> int:
        return self._counts[0]

    @property
    def num_decode_tokens(self) -> int:
        return self._counts[1]

    @property
    def num_prefill_seqs(self) -> int:
        return self._counts[2]

    @property
    def num_decode_seqs(self) -> int:
        return self._counts[3]

    @property
    def prefill_attention_work(self) -> int:
        """Query-key pairs of the prefill chunks: chunk tokens x the context they attend to (cache + chunk)."""
        return self._counts[4]

    @property
    def decode_context_tokens(self) -> int:
        """Keys the decodes read: the sum of their context lengths (including the new token)."""
        return self._counts[5]
