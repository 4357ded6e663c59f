"""Pipeline parallelism on CPU with gloo: PP2 (and TP2-PP2) greedy tokens equal to one process and to HF
transformers in fp32, micro-batches in flight at once with per-stage timing on every record, each stage holding
its layers' KV cache only, and a stage worker killed mid-run."""
import os
import signal
import threading
import time

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.distributed import validation
from tests.engine.distributed.conftest import MAX_TOKENS, check_tokens_equal
from tests.helpers.engine import run_staggered


def engine(pp: int = 2, tp: int = 1, **kwargs) -> LLMEngine:
    return LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu", pipeline_parallel_size=pp,
                                 tensor_parallel_size=tp, **kwargs)


@pytest.mark.slow
def test_pp2_tokens_equal_one_process_and_hf(tiny_path, prompts):
    parallel = engine(max_num_seqs=6)
    try:
        check_tokens_equal(parallel, tiny_path, prompts)
    finally:
        parallel.shutdown()


@pytest.mark.slow
def test_tp2_pp2_tokens_equal_one_process_and_hf(tiny_path, prompts, monkeypatch):
    """Four ranks: two stages, each split over two tensor-parallel ranks (on a machine with fewer cores, the
    check of one core per rank is lifted: the ranks share them)."""
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(validation.os, "sched_getaffinity", lambda pid: set(range(max(4, cores))))
    parallel = engine(tp=2, max_num_seqs=6)
    try:
        check_tokens_equal(parallel, tiny_path, prompts)
    finally:
        parallel.shutdown()


def test_micro_batches_fly_at_once_and_every_record_has_both_stages(prompts, no_orphans):
    parallel = engine(scheduler="sarathi", chunk_size=32)
    pipeline, submit, in_flight = parallel.batches, parallel.batches.submit, []

    def counted_submit(output, now):
        flying = {u.request_id for mb, _ in pipeline.in_flight for u in mb.units}
        assert not flying & {u.request_id for u in output.units}  # a request in flight is not scheduled again
        submit(output, now)
        in_flight.append(len(pipeline.in_flight))

    pipeline.submit = counted_submit
    try:
        assert len(parallel.runner.local.kv_caches) == 1  # tiny's 2 layers: one per stage, its KV cache only
        run_staggered(parallel, prompts, MAX_TOKENS, gap=0)
    finally:
        parallel.shutdown()
    records = parallel.batch_records
    assert max(in_flight) == 2
    # how many overlap is a timing figure (benchmarks/), which two busy processes on 2 cores move from run to run
    assert any(b.start_time < a.end_time for a, b in zip(records, records[1:], strict=False))
    assert all(len(r.stage_busy_s) == len(r.stage_idle_s) == len(r.stage_handoff_s) == 2 for r in records)
    assert all(busy > 0 for r in records for busy in r.stage_busy_s)
    # stage 1 takes every micro-batch in some time, within its idle time; stage 0's step is its busy time
    assert all(r.stage_handoff_s[0] == 0 and 0 < r.stage_handoff_s[1] <= r.stage_idle_s[1] for r in records)
    assert all(r.end_time - r.start_time >= max(r.stage_busy_s) for r in records)


def test_stage_worker_killed_mid_run_ends_every_request_with_the_cause(no_orphans):
    parallel = engine()
    worker = parallel.runner.workers.workers[0].process  # rank 1: the last stage
    long = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    ids = [parallel.add_request([1 + i, 2, 3], long) for i in range(8)]
    threading.Timer(0.5, os.kill, (worker.pid, signal.SIGKILL)).start()  # while micro-batches fly
    finished = {}
    deadline = time.monotonic() + 60
    while len(finished) < len(ids) and time.monotonic() < deadline:
        finished |= {out.request_id: out for out in parallel.step() if out.finished}
    assert set(finished) == set(ids)
    for out in finished.values():
        assert out.finish_reason == "error"
        assert out.error == f"the engine stopped: worker rank 1 (pid {worker.pid}) killed by SIGKILL"
