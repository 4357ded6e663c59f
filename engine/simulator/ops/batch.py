"""``StageBatch``: what one pipeline stage computes for one micro-batch, the cost model's input."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageBatch:
    """What one pipeline stage computes for one micro-batch (every stage sees the same tokens)."""
    prefill_chunks: tuple[tuple[int, int], ...] = ()  # (new tokens of the chunk, tokens already cached)
    decode_contexts: tuple[int, ...] = ()             # each decode's context length incl. its new token
    # Counted once at construction (not cached properties: 3.11's take a lock on every read, and the cost
    # model reads them every iteration).
    num_tokens: int = field(init=False, repr=False, compare=False)
    decode_context_tokens: int = field(init=False, repr=False, compare=False)  # cached tokens the decodes read

    @classmethod
    def of(cls, scheduler_output) -> StageBatch:
        """From an engine.scheduler.output.SchedulerOutput: its units are decodes (one new token each) first."""
        units, decodes = scheduler_output.units, scheduler_output.num_decode_seqs
        return cls(tuple((len(u.token_ids), u.num_computed_tokens) for u in units[decodes:]),
                   tuple(u.num_computed_tokens + 1 for u in units[:decodes]))

    def __post_init__(self):
        object.__setattr__(self, "num_tokens", sum(c for c, _ in self.prefill_chunks) + len(self.decode_contexts))
        object.__setattr__(self, "decode_context_tokens", sum(self.decode_contexts))

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_chunks) + len(self.decode_contexts)
