"""``StageBatch``: what one pipeline stage computes for one micro-batch, the cost model's input."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class StageBatch:
    """What one pipeline stage computes for one micro-batch (every stage sees the same tokens)."""
    prefill_chunks: tuple[tuple[int, int], ...] = ()  # (new tokens of the chunk, tokens already cached)
    decode_contexts: tuple[int, ...] = ()             # each decode's context length incl. its new token

    @classmethod
    def of(cls, scheduler_output) -> StageBatch:
        """From an engine.scheduler.output.SchedulerOutput: its units are decodes (one new token each) first."""
        units, decodes = scheduler_output.units, scheduler_output.num_decode_seqs
        return cls(tuple((len(u.token_ids), u.num_computed_tokens) for u in units[decodes:]),
                   tuple(u.num_computed_tokens + 1 for u in units[:decodes]))

    @cached_property
    def num_tokens(self) -> int:
        return sum(c for c, _ in self.prefill_chunks) + len(self.decode_contexts)

    @cached_property
    def decode_context_tokens(self) -> int:
        """Cached tokens the decodes read, all together."""
        return sum(self.decode_contexts)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_chunks) + len(self.decode_contexts)
