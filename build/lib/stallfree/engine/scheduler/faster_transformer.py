"""FasterTransformer: request-level (static) batching, decode-prioritizing."""
from __future__ import annotations

from stallfree.engine.scheduler.base import Batch, Scheduler, register


@register
class FasterTransformerScheduler(Scheduler):
    """Request-level batching: admit a batch only when nothing runs, then decode it to completion."""

    name = "faster_transformer"
    reserve_worst_case = True

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        if self.running:
            self.schedule_decodes(batch)
        else:
            self.admit_whole_prefills(batch, now)
        return batch
