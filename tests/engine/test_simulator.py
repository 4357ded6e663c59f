"""SimulatedRunner: the real schedulers and KV accounting with iteration times from a fitted cost model."""
import random
import time

import pytest

from engine import LLMEngine, SamplingParams
from engine.outputs import BatchRecord
from engine.runner.cost_model import CostModel

FIXED = CostModel(intercept=0.004, num_prefill_tokens=2e-5, num_decode_tokens=3e-4, num_kv_blocks_used=1e-5)


def record(prefill: int, decode: int, blocks: int, seconds: float) -> BatchRecord:
    return BatchRecord(iteration=0, start_time=10.0, end_time=10.0 + seconds, num_prefill_tokens=prefill,
                       num_decode_tokens=decode, num_prefill_seqs=int(prefill > 0), num_decode_seqs=decode,
                       num_preemptions=0, num_kv_blocks_used=blocks, num_waiting=0, num_running=0)


def test_fit_recovers_a_linear_cost_model():
    rng = random.Random(0)
    shapes = [(rng.randrange(0, 512), rng.randrange(0, 64), rng.randrange(1, 400)) for _ in range(50)]
    fitted = CostModel.fit([record(p, d, b, FIXED.predict(p, d, b)) for p, d, b in shapes])
    for name in ("intercept", "num_prefill_tokens", "num_decode_tokens", "num_kv_blocks_used"):
        assert getattr(fitted, name) == pytest.approx(getattr(FIXED, name), rel=1e-6)


def test_fit_never_gives_a_negative_per_unit_cost():
    """Times that fall with decode tokens (noise on an overhead-bound model) must not make decodes free or
    negative-cost in the simulation: that feature is dropped instead."""
    records = [record(p, d, 10, 0.002 + 1e-5 * p - 1e-4 * d) for p in (0, 100, 200) for d in (0, 4, 8)]
    fitted = CostModel.fit(records)
    assert fitted.num_decode_tokens == 0.0 and fitted.num_prefill_tokens > 0
    assert all(fitted.predict(p, d, 10) > 0 for p in (0, 200) for d in (0, 64))
    with pytest.raises(ValueError, match="at least"):
        CostModel.fit(records[:2])


@pytest.fixture
def fixed_cost_model(tmp_path):
    path = tmp_path / "cost.json"
    FIXED.save(path)
    return str(path)


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "faster_transformer"])
def test_virtual_clock_replays_thousands_of_requests_in_seconds(policy, fixed_cost_model):
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual", cost_model=fixed_cost_model,
                                   scheduler=policy, chunk_size=128, kv_memory_gib=0.02)
    rng = random.Random(1)
    max_tokens = {}
    for i in range(1000):
        max_tokens[f"r{i}"] = rng.randint(1, 40)
        engine.add_request([rng.randrange(3, 2000) for _ in range(rng.randint(1, 300))],
                           SamplingParams(max_tokens=max_tokens[f"r{i}"]), request_id=f"r{i}",
                           arrival_time=0.05 * i)  # 20 QPS of simulated time
    finished = {}
    wall = time.monotonic()
    while engine.has_unfinished():
        finished |= {o.request_id: o for o in engine.step() if o.finished}
    assert time.monotonic() - wall < 60
    # Every request ran to its max_tokens (the simulator never samples EOS), after it arrived.
    assert {rid: len(o.token_ids) for rid, o in finished.items()} == max_tokens
    assert all(o.metrics.first_scheduled_time >= o.metrics.arrival_time for o in finished.values())
    assert engine.clock() >= 0.05 * 999
    # Each iteration took exactly what the cost model predicts for it.
    for r in engine.batch_records[:200]:
        assert r.end_time - r.start_time == pytest.approx(
            FIXED.predict(r.num_prefill_tokens, r.num_decode_tokens, r.num_kv_blocks_used), abs=0.002)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_profiling_fits_the_real_runner_once(monkeypatch):
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    cost = engine.runner.cost_model
    assert cost.num_prefill_tokens > 0 and cost.intercept >= 0  # prefill tokens cost time on the real runner
    def no_refit(records):
        raise AssertionError("profiled again")

    monkeypatch.setattr(CostModel, "fit", no_refit)
    again = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    assert again.runner.cost_model == cost  # read back from the cache, not profiled again


def test_real_clock_sleeps_the_predicted_time(fixed_cost_model):
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", cost_model=fixed_cost_model)
    engine.add_request([5] * 100, SamplingParams(max_tokens=3))
    start = time.time()
    while engine.has_unfinished():
        engine.step()
    predicted = sum(FIXED.predict(r.num_prefill_tokens, r.num_decode_tokens, r.num_kv_blocks_used)
                    for r in engine.batch_records)
    assert time.time() - start >= predicted
    assert engine.batch_records[0].start_time >= start  # wall-clock timestamps


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(runner="gpu"), "model.runner"),
    (dict(runner="simulated", clock="sundial"), "model.clock"),
    (dict(runner="simulated", cost_model="/nonexistent/cost.json"), "model.cost_model"),
])
def test_bad_simulator_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_kwargs(model="tiny", **kwargs)
