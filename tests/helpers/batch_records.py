"""A BatchRecord with every field set, for tests of what carries batch rows."""
import dataclasses

from stallfree.engine.records import BatchRecord


def example_batch_record(**changes) -> BatchRecord:
    record = BatchRecord(iteration=3, start_time=10.0, end_time=10.5, num_prefill_tokens=7, num_decode_tokens=2,
                         num_prefill_seqs=1, num_decode_seqs=2, prefill_attention_work=49, decode_context_tokens=40,
                         num_preemptions=0, num_kv_blocks_used=4, num_waiting=1, num_running=3,
                         stage_busy_s=[0.2, 0.3], stage_idle_s=[0.0, 0.1], mfu=0.25)
    return dataclasses.replace(record, **changes)
