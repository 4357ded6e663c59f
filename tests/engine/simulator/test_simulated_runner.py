"""SimulatedRunner: the real schedulers and KV accounting with iteration times from a fitted cost model."""
import random
import statistics
import time

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.records import BatchRecord
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.scheduler import ScheduledUnit, SchedulerOutput
from stallfree.engine.simulator.fitting.cost_model import ENGINE_REVISION, CostModel, IterationFeatures
from stallfree.engine.simulator.simulated_runner import SimulatedRunner
from tests.helpers.engine import FIXED


def record(prefill: int, decodes: int, work: int, context: int, seconds: float) -> BatchRecord:
    return BatchRecord(iteration=0, start_time=10.0, end_time=10.0 + seconds, num_prefill_tokens=prefill,
                       num_decode_tokens=decodes, num_prefill_seqs=int(prefill > 0), num_decode_seqs=decodes,
                       prefill_attention_work=work, decode_context_tokens=context, num_preemptions=0,
                       num_kv_blocks_used=0, num_waiting=0, num_running=0)


def predicted(model: CostModel, r: BatchRecord) -> float:
    return model.predict(IterationFeatures.of(r))


def random_shapes(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(n):
        prefill, decodes = rng.randrange(0, 512), rng.randrange(0, 64)
        shapes.append((prefill, decodes, prefill * rng.randrange(prefill, 2048) if prefill else 0,
                       decodes * rng.randrange(16, 1024)))
    return shapes


def test_fit_recovers_a_linear_cost_model_and_reports_its_held_out_error():
    shapes = random_shapes(80, seed=0)
    fitted = CostModel.fit([record(*s, predicted(FIXED, record(*s, 0))) for s in shapes], fitted_on={"model": "x"})
    for name, value in FIXED.coefficients.items():
        assert fitted.coefficients[name] == pytest.approx(value, rel=1e-6)
    assert fitted.holdout_error["median_abs_pct"] < 1e-6 and fitted.holdout_error["num_iterations"] == 16
    assert all(q == pytest.approx([1.0] * len(q)) for kind in fitted.residual_quantiles.values() for q in kind)
    assert fitted.fitted_on["model"] == "x" and fitted.fitted_on["num_records"] == 80


def test_fit_separates_the_fixed_cost_of_running_decodes():
    """Iterations with decodes pay a fixed 3 ms more than prefill-only ones: the fit puts that in
    decode_pass, not in the intercept that a lone prompt's prefill also pays."""
    truth = CostModel(coefficients={**FIXED.coefficients, "decode_pass": 0.003})
    shapes = random_shapes(120, seed=4) + [(p, 0, p * p, 0) for p in range(16, 512, 16)]
    fitted = CostModel.fit([record(*s, predicted(truth, record(*s, 0))) for s in shapes])
    assert fitted.coefficients["decode_pass"] == pytest.approx(0.003, rel=1e-6)
    assert fitted.coefficients["intercept"] == pytest.approx(FIXED.coefficients["intercept"], rel=1e-6)


def test_residuals_replay_the_spread_of_real_iterations():
    """Iterations 20% slower one time in ten: the fit keeps that tail and the simulator draws it."""
    shapes = random_shapes(200, seed=1)
    records = [record(*s, predicted(FIXED, record(*s, 0)) * (1.2 if i % 10 == 0 else 1.0))
               for i, s in enumerate(shapes)]
    fitted = CostModel.fit(records)
    ratios = [fitted.sample(IterationFeatures(100, 8, 100 * 300, 8 * 300), random.Random(i))
              / fitted.predict(IterationFeatures(100, 8, 100 * 300, 8 * 300)) for i in range(2000)]
    slow = sum(r > 1.1 for r in ratios) / len(ratios)
    assert 0.04 < slow < 0.2 and max(ratios) / min(ratios) == pytest.approx(1.2, rel=0.05)


def test_residual_spread_follows_the_iteration_length():
    """Short iterations that vary by +-30% and long ones that do not: the long ones' simulated time must not
    take the short ones' spread."""
    base = [(s, predicted(FIXED, record(*s, 0))) for s in random_shapes(300, seed=2)]
    median = sorted(t for _, t in base)[len(base) // 2]
    records = [record(*s, t * (1 + (0.3 if i % 2 else -0.3) * (t < median))) for i, (s, t) in enumerate(base)]
    fitted = CostModel.fit(records)
    assert len(fitted.residual_quantiles["hybrid"]) == 3 and len(fitted.residual_bounds_s["hybrid"]) == 2

    def spread(features: IterationFeatures) -> float:
        draws = [fitted.sample(features, random.Random(i)) for i in range(500)]
        return (max(draws) - min(draws)) / fitted.predict(features)

    assert spread(IterationFeatures(500, 60, 500 * 2000, 60 * 1000)) < 0.1
    assert spread(IterationFeatures(0, 2, 0, 2 * 16)) > 0.4


def test_prefill_iterations_do_not_take_the_spread_of_decode_steps():
    """Decode-only steps that vary by +-30% and prefill iterations as long that do not: a simulated prefill
    iteration keeps its own spread (the decode steps at batch 40-64 last as long as the 600-900-token chunks)."""
    shapes = [(0, rng_decodes, 0, rng_decodes * 500) for rng_decodes in range(40, 64)] * 8
    shapes += [(prefill, 2, prefill * prefill, 2 * 500) for prefill in range(600, 900, 10)] * 6
    records = [record(*s, predicted(FIXED, record(*s, 0)) * (1 + (0.3 if i % 2 else -0.3) * (s[0] == 0)))
               for i, s in enumerate(shapes)]
    fitted = CostModel.fit(records)

    def spread(features: IterationFeatures) -> float:
        draws = [fitted.sample(features, random.Random(i)) for i in range(500)]
        return (max(draws) - min(draws)) / fitted.predict(features)

    assert spread(IterationFeatures(750, 2, 750 * 750, 1000)) < 0.1
    assert spread(IterationFeatures(0, 50, 0, 50 * 500)) > 0.4


def test_prefill_only_iterations_keep_their_own_residuals_apart_from_hybrids():
    """Prefill-only iterations (vllm's) 15% slower than hybrids of the same work (sarathi's): the one linear
    fit sits between them, and each kind's residuals carry it back to its own time."""
    hybrids = [(p, d, p * p, d * 300) for p in range(64, 512, 16) for d in (4, 16, 32)]
    prefill_only = [(p, 0, p * p, 0) for p in range(64, 512, 8)]
    records = [record(*s, predicted(FIXED, record(*s, 0))) for s in hybrids]
    records += [record(*s, predicted(FIXED, record(*s, 0)) * 1.15) for s in prefill_only]
    fitted = CostModel.fit(records)

    def mean_ratio(shape) -> float:
        features = IterationFeatures(*shape)
        return statistics.mean(fitted.sample(features, random.Random(i)) for i in range(400)) / FIXED.predict(features)

    assert mean_ratio((256, 0, 256 * 256, 0)) == pytest.approx(1.15, rel=0.03)
    assert mean_ratio((256, 16, 256 * 256, 16 * 300)) == pytest.approx(1.0, rel=0.03)


def test_a_version_6_model_gives_hybrids_the_prefill_kind():
    model = CostModel(coefficients={"intercept": 0.01}, residual_quantiles={"decode": [[1.0]], "prefill": [[2.0]]},
                      residual_bounds_s={"decode": [], "prefill": []}, speed_factors={"prefill": 1.5})
    assert model.sample(IterationFeatures(8, 1, 64, 10), random.Random(0)) == pytest.approx(0.03)


def test_rare_disturbed_iterations_are_left_out_of_the_fit_and_the_spread():
    """Two decode steps 8x their time (a VM neighbour) among 200 that vary by +-5%: the fit and the simulated
    spread keep the engine's own variation, and the cost model counts what it left out."""
    shapes = random_shapes(200, seed=3)
    records = [record(*s, predicted(FIXED, record(*s, 0)) * (8.0 if i in (5, 77) else 1 + 0.05 * (i % 3 - 1)))
               for i, s in enumerate(shapes)]
    fitted = CostModel.fit(records)
    assert fitted.fitted_on["num_disturbed"] == 2
    for shape in shapes[:20]:
        features = IterationFeatures(*shape)
        assert fitted.predict(features) == pytest.approx(FIXED.predict(features), rel=0.03)
    assert max(q for kind in fitted.residual_quantiles.values() for bucket in kind for q in bucket) < 1.1


def test_a_flat_residual_list_is_one_bucket():
    model = CostModel(coefficients={"intercept": 0.01}, residual_quantiles=[0.5, 1.5])
    draws = {model.sample(IterationFeatures(0, 1, 0, 1), random.Random(i)) for i in range(50)}
    assert draws == {0.005, 0.015}


def test_fit_never_gives_a_negative_per_unit_cost():
    """Times that fall with decodes (noise on an overhead-bound model) must not make decodes free or
    negative-cost in the simulation: that feature is dropped instead."""
    records = [record(p, d, p * p, d * 100, 0.002 + 1e-5 * p - 1e-4 * d) for p in (0, 100, 200) for d in (0, 4, 8)]
    fitted = CostModel.fit(records * 2)
    assert fitted.coefficients["num_decode_seqs"] == 0.0 and fitted.coefficients["num_prefill_tokens"] > 0
    assert all(fitted.coefficients[name] >= 0 for name in fitted.coefficients if name != "intercept")
    with pytest.raises(ValueError, match="at least"):
        CostModel.fit(records[:2])


def test_an_old_cost_model_file_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"coefficients": {"num_kv_blocks_used": 1e-5}}')
    with pytest.raises(ValueError, match="model.cost_model.*stallfree-profile"):
        CostModel.load(path)


def test_a_profile_of_an_older_engine_loads_with_a_warning_naming_it(tmp_path, caplog):
    records = [record(*s, predicted(FIXED, record(*s, 0))) for s in random_shapes(40, seed=1)]
    CostModel.fit(records, fitted_on={"engine_revision": ENGINE_REVISION}).save(tmp_path / "current.json")
    CostModel.fit(records, fitted_on={}).save(tmp_path / "old.json")  # before revisions were recorded
    with caplog.at_level("WARNING", logger="stallfree.engine.simulator.fitting.cost_model"):
        CostModel.load(tmp_path / "current.json")
        assert not caplog.text
        CostModel.load(tmp_path / "old.json")
    assert f"old.json was profiled on engine revision 1, this engine is revision {ENGINE_REVISION}" in caplog.text


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
        assert r.end_time - r.start_time == pytest.approx(predicted(FIXED, r), abs=0.002)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_profiling_fits_the_real_runner_once(monkeypatch):
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    cost = engine.runner.cost_model
    assert cost.coefficients["num_prefill_tokens"] > 0  # prefill tokens cost time on the real runner
    assert cost.fitted_on["model"] == "tiny" and cost.holdout_error["num_iterations"] > 0

    def no_refit(*args, **kwargs):
        raise AssertionError("profiled again")

    monkeypatch.setattr(CostModel, "fit", no_refit)
    again = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    assert again.runner.cost_model == cost  # read back from the cache, not profiled again


def test_profile_requests_sample_as_the_load_generator_does_and_fill_the_context(monkeypatch):
    """Greedy, with ignore_eos: a profile that samples randomly measures a cost the studies never pay. Each
    policy's profile also holds a prompt as long as the context holds: vllm's longest whole-prompt prefill."""
    from stallfree.engine.simulator.fitting.profile import profile_cost_model

    added: list[tuple[int, SamplingParams]] = []
    real_add = LLMEngine.add_request

    def recording_add(self, prompt, params=None, **kwargs):
        added.append((len(prompt), params))
        return real_add(self, prompt, params, **kwargs)

    monkeypatch.setattr(LLMEngine, "add_request", recording_add)
    config = LLMEngine.from_kwargs(model="tiny", max_model_len=512).config
    profile_cost_model(config, LLMEngine, num_requests=3, use_cache=False)
    assert len(added) == 3 * (3 + 2) and all(p.greedy and p.ignore_eos for _, p in added)
    longest = [n + p.max_tokens for n, p in added if n > 256]
    assert longest.count(512) == 3  # prompt and output fill the context, once per profiled policy


def test_real_clock_sleeps_the_predicted_time(fixed_cost_model):
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", cost_model=fixed_cost_model)
    engine.add_request([5] * 100, SamplingParams(max_tokens=3))
    start = time.time()
    while engine.has_unfinished():
        engine.step()
    assert time.time() - start >= sum(predicted(FIXED, r) for r in engine.batch_records)
    assert engine.batch_records[0].start_time >= start  # wall-clock timestamps


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(runner="gpu"), "model.runner"),
    (dict(runner="simulated", clock="sundial"), "model.clock"),
    (dict(runner="simulated", cost_model="/nonexistent/cost.json"), "model.cost_model"),
])
def test_bad_simulator_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_kwargs(model="tiny", **kwargs)


def unit(request_id, token_ids, computed, block_table, *, samples=True, is_prefill=True):
    return ScheduledUnit(request_id=request_id, token_ids=token_ids, num_computed_tokens=computed,
                         is_prefill=is_prefill, samples=samples, block_table=block_table,
                         sampling_params=SamplingParams(max_tokens=4, temperature=0.0))


def test_simulated_runner_charges_the_cost_model_and_samples_only_sampling_units():
    cost = CostModel(coefficients={"intercept": 0.01, "num_prefill_tokens": 0.001, "num_decode_seqs": 0.002,
                                   "decode_context_tokens": 1e-5})
    clock = VirtualClock(start=100.0)
    runner = SimulatedRunner(cost, vocab_size=50, eos_token_ids={2}, clock=clock, seed=0)
    output = SchedulerOutput([unit("d", [7], 30, [0, 1, 2, 3], is_prefill=False),
                              unit("p", list(range(40)), 0, [4, 5, 6, 7, 8], samples=False)])
    sampled = runner.execute_model(output).sampled_token_ids
    assert set(sampled) == {"d"} and sampled["d"] != 2 and 0 <= sampled["d"] < 50
    assert clock() == pytest.approx(100.0 + 0.01 + 40 * 0.001 + 1 * 0.002 + 31 * 1e-5)
