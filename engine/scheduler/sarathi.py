"""Sarathi-Serve: chunked prefills with stall-free batching."""
from __future__ import annotations

from stallfree.engine.scheduler.base import Batch, Scheduler, register


@register
class SarathiScheduler(Scheduler):
    """Stall-free batching: every decode each iteration, prefill chunks fill the rest of ``chunk_size``."""

    name = "sarathi"
    chunked = True

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        self.schedule_decodes(batch)
        self.schedule_prefill_chunks(batch, self.config.chunk_size - len(batch.decodes), now)
        return batch
