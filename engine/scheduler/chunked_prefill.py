"""The paper's chunked-prefills-only ablation."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS, Batch, Scheduler


@SCHEDULERS.register("chunked_prefill")
class ChunkedPrefillScheduler(Scheduler):
    """Chunked prefills without stall-free batching: prefill-chunk and decode iterations alternate."""

    chunked = True

    def __init__(self, config, kv, max_model_len, eos_token_ids):
        super().__init__(config, kv, max_model_len, eos_token_ids)
        self.last_was_prefill = False

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        decodes_waiting = any(r.is_decode for r in self.schedulable())
        if not (self.last_was_prefill and decodes_waiting):
            self.schedule_prefill_chunks(batch, self.config.chunk_size, now)
        self.last_was_prefill = bool(batch.chunks)
        if not batch.chunks:
            self.schedule_decodes(batch)
        return batch
