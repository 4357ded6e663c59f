"""Sarathi-Serve: chunked prefills with stall-free batching."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS, Batch, Scheduler


@SCHEDULERS.register("sarathi")
class SarathiScheduler(Scheduler):
    """Stall-free batching: every decode each iteration, prefill chunks fill the rest of ``chunk_size``."""

    chunked = True

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        self.schedule_decodes(batch)
        self.schedule_prefill_chunks(batch, self.config.chunk_size - len(batch.decodes), now)
        return batch
