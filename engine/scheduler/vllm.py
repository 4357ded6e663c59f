"""vLLM (v0 default) prefill-prioritizing policy."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS, Batch, Scheduler


@SCHEDULERS.register("vllm")
class VLLMScheduler(Scheduler):
    """Prefill-prioritizing: whole prefills FCFS under a token budget; decode-only iterations otherwise."""


    def __init__(self, config, kv, max_model_len, eos_token_ids):
        super().__init__(config, kv, max_model_len, eos_token_ids)
        if config.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= max_model_len "
                f"({max_model_len}) for the vllm policy, which never splits a prompt")

    def build_batch(self, now: float) -> Batch:
        batch = Batch()
        self.admit_whole_prefills(batch, now, token_budget=self.config.max_num_batched_tokens)
        if not batch.chunks:
            self.schedule_decodes(batch)
        return batch
