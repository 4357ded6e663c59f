"""The five scheduling policies of the study (see DESIGN.md section 2)."""
from __future__ import annotations

from engine.scheduler.base import Batch, Scheduler, register


@register
class VLLMScheduler(Scheduler):
    """Prefill-prioritizing: whole prefills FCFS under a token budget; decode-only iterations otherwise."""

    name = "vllm"

    def __init__(self, config, kv, max_model_len):
        super().__init__(config, kv, max_model_len)
        if config.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= max_model_len "
                f"({max_model_len}) for the vllm policy, which never splits a prompt")

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self.admit_whole_prefills(batch, now, token_budget=self.config.max_num_batched_tokens)
        if not batch.units:
            self.schedule_decodes(batch)
        return batch


@register
class OrcaScheduler(Scheduler):
    """Iteration-level hybrid batches: all decodes + whole new prefills, worst-case KV reservation."""

    name = "orca"
    reserve_worst_case = True

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self.schedule_decodes(batch)
        self.admit_whole_prefills(batch, now)
        return batch


@register
class FasterTransformerScheduler(Scheduler):
    """Request-level batching: admit a batch only when nothing runs, then decode it to completion."""

    name = "faster_transformer"
    reserve_worst_case = True

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        if self.running:
            self.schedule_decodes(batch)
        else:
            self.admit_whole_prefills(batch, now)
        return batch


@register
class SarathiScheduler(Scheduler):
    """Stall-free batching: every decode each iteration, prefill chunks fill the rest of ``chunk_size``."""

    name = "sarathi"

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self.schedule_decodes(batch)
        self.schedule_prefill_chunks(batch, self.config.chunk_size - len(batch.units), now)
        return batch


@register
class ChunkedPrefillScheduler(Scheduler):
    """Chunked prefills without stall-free batching: prefill-chunk and decode iterations alternate."""

    name = "chunked_prefill"

    def __init__(self, config, kv, max_model_len):
        super().__init__(config, kv, max_model_len)
        self.last_was_prefill = False

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        decodes_waiting = any(r.is_decode for r in self.running)
        if not (self.last_was_prefill and decodes_waiting):
            self.schedule_prefill_chunks(batch, self.config.chunk_size, now)
        self.last_was_prefill = bool(batch.units)
        if not batch.units:
            self.schedule_decodes(batch)
        return batch
