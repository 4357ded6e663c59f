"""A tiny simulated deployment end to end: the real engine, schedulers and KV accounting over pipeline stages
timed by a fake operator cost model (tests/helpers/fakes/operator_cost_model.py)."""
import random

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.simulator.deployment import Deployment
from tests.helpers.fakes.operator_cost_model import fake_resolved


@pytest.fixture(autouse=True)
def fake_cost_model(monkeypatch):
    monkeypatch.setattr(Deployment, "resolve", lambda self: fake_resolved())


def engine(policy: str, pp: int, num_blocks: int | None = None) -> LLMEngine:
    return LLMEngine.from_kwargs(model="fake-deployment", runner="simulated", clock="virtual", scheduler=policy,
                                 chunk_size=64, max_num_batched_tokens=1024, max_model_len=1024,
                                 num_blocks=num_blocks, deployment={"gpu": "fake-gpu", "shape": "fake-1b", "pp": pp})


def run(llm: LLMEngine, n: int = 40, seed: int = 0) -> dict:
    """n requests arriving over ~1 s of simulated time; the outputs by request id."""
    rng, done = random.Random(seed), {}
    for i in range(n):
        prompt = [rng.randrange(10, 1000) for _ in range(rng.randint(1, 300))]
        llm.add_request(prompt, SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=True), request_id=f"r{i}",
                        arrival_time=i * 0.025)
    while llm.has_unfinished():
        for out in llm.step():
            if out.finished:
                done[out.request_id] = out
    return done


@pytest.mark.parametrize("policy", ["vllm", "orca", "sarathi", "chunked_prefill", "hybrid"])
def test_every_request_completes_through_two_stages(policy):
    llm = engine(policy, pp=2)
    done = run(llm)
    assert len(done) == 40 and llm.kv.num_used_blocks == 0
    for out in done.values():
        times = out.metrics.token_times
        assert len(out.token_ids) == len(times) and times == sorted(times)
        assert out.metrics.first_scheduled_time < times[0]
    records = llm.batch_records
    assert all(len(r.stage_busy_s) == 2 and len(r.stage_idle_s) == 2 for r in records)
    assert all(r.end_time - r.start_time >= sum(r.stage_busy_s) - 1e-12 for r in records)


def test_a_request_in_flight_is_never_scheduled_again():
    llm = engine("sarathi", pp=2, num_blocks=60)  # few blocks: preemptions happen too
    runner, submit, overlaps, in_flight_max = llm.runner, llm.runner.submit, [], [0]

    def checked_submit(output, now):
        flying = {u.request_id for mb in runner.in_flight for u in mb.output.units}
        overlaps.extend(flying & {u.request_id for u in output.units})
        in_flight_max[0] = max(in_flight_max[0], len(runner.in_flight) + 1)
        return submit(output, now)

    runner.submit = checked_submit
    done = run(llm, n=60)
    assert len(done) == 60 and overlaps == []
    assert in_flight_max[0] == 2  # two micro-batches did fly at once
    assert sum(r.num_preemptions for r in llm.batch_records) > 0


def test_micro_batches_overlap_across_stages():
    """With two stages, a micro-batch starts while the one before it is still in the second stage."""
    llm = engine("sarathi", pp=2)
    run(llm)
    records = llm.batch_records
    overlapping = sum(b.start_time < a.end_time for a, b in zip(records, records[1:], strict=False))
    assert overlapping > len(records) / 2


def test_uniform_hybrid_batches_leave_fewer_bubbles_than_prefill_prioritizing_ones():
    def bubble_fraction(policy: str) -> float:
        llm = engine(policy, pp=2)
        run(llm, n=80)
        busy = sum(sum(r.stage_busy_s) for r in llm.batch_records)
        idle = sum(sum(r.stage_idle_s) for r in llm.batch_records)
        return idle / (busy + idle)

    assert bubble_fraction("sarathi") < 0.8 * bubble_fraction("vllm")


def test_one_stage_runs_one_micro_batch_at_a_time():
    llm = engine("sarathi", pp=1)
    run(llm)
    records = llm.batch_records
    assert all(b.start_time >= a.end_time for a, b in zip(records, records[1:], strict=False))
    assert all(b.stage_idle_s == [0.0] for a, b in zip(records, records[1:], strict=False)
               if b.start_time == a.end_time)  # back to back: no bubble
