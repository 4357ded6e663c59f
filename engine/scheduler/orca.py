"""Orca: iteration-level hybrid batches with a worst-case KV reservation."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS, Batch, Scheduler


@SCHEDULERS.register("orca")
class OrcaScheduler(Scheduler):
    """Iteration-level hybrid batches: all decodes + whole new prefills, worst-case KV reservation."""

    reserve_worst_case = True

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        self.schedule_decodes(batch)
        self.admit_whole_prefills(batch, now)
        return batch
