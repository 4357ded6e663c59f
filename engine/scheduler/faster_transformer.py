"""FasterTransformer: request-level (static) batching, decode-prioritizing."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS, Batch, Scheduler


@SCHEDULERS.register("faster_transformer")
class FasterTransformerScheduler(Scheduler):
    """Request-level batching: admit a batch only when nothing runs, then decode it to completion."""

    reserve_worst_case = True

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        if self.running:
            self.schedule_decodes(batch)
        else:
            self.admit_whole_prefills(batch, now)
        return batch
