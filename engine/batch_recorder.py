"""One BatchRecord per finished micro-batch: what the scheduler put in it, what the runner measured, and what
the KV cache and the queues hold after it."""
from __future__ import annotations

import itertools
from typing import Any

from stallfree.engine.records import BatchRecord
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput


class BatchRecorder:
    """``instance``: which instance of a disaggregated deployment the engine is (None: colocated)."""

    def __init__(self, kv: Any, utilization: Any, instance: str | None = None):
        self.kv, self.utilization, self.instance = kv, utilization, instance
        self.iterations = itertools.count()  # kept apart from the records, which a server may drain
        self.prefix_counts = (0, 0, 0)  # the KV manager's prefix-cache counters at the last record

    def record(self, out: SchedulerOutput, start: float, end: float, result: ModelRunnerOutput, num_waiting: int,
               num_running: int) -> BatchRecord:
        kv, last = self.kv, self.prefix_counts
        self.prefix_counts = (kv.num_query_tokens, kv.num_hit_tokens, kv.num_evictions)
        queried, cached, evicted = (now - before for now, before in zip(self.prefix_counts, last, strict=True))
        return BatchRecord(
            iteration=next(self.iterations), start_time=start, end_time=end,
            num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
            num_prefill_seqs=out.num_prefill_seqs, num_decode_seqs=out.num_decode_seqs,
            prefill_attention_work=out.prefill_attention_work, decode_context_tokens=out.decode_context_tokens,
            num_preemptions=len(out.preempted_request_ids), num_kv_blocks_used=kv.num_used_blocks,
            num_waiting=num_waiting, num_running=num_running,
            stage_busy_s=list(result.stage_busy_s), stage_idle_s=list(result.stage_idle_s),
            stage_handoff_s=list(result.stage_handoff_s), cpu_threads=result.cpu_threads, instance=self.instance,
            prefix_cache_queried_tokens=queried, num_cached_tokens=cached, num_kv_blocks_evicted=evicted,
            num_kv_blocks_cached=kv.num_cached_free_blocks,
            **self.utilization.fields(out.units, end - start, result.operator_split))
