"""A real pipeline simulated: stage cost models fitted on each stage's busy seconds, and an engine of the same
deployment config on runner=simulated stepping a FittedPipelineRunner on the virtual clock."""
import dataclasses
import statistics

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records import BatchRecord
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput
from stallfree.engine.simulator.fitted_pipeline import FittedPipelineRunner, StageCostModels
from stallfree.engine.simulator.fitting.cost_model import CostModel, IterationFeatures

STAGE_S = ((0.002, 1e-5), (0.004, 2e-5))  # per stage: seconds per iteration, per prefill token


def records(n: int = 60) -> list[BatchRecord]:
    """Records of a two-stage run whose stage times are linear in the prefill tokens."""
    out = []
    for i in range(n):
        tokens = 16 * (i % 12)
        busy = [fixed + per_token * tokens for fixed, per_token in STAGE_S]
        out.append(BatchRecord(iteration=i, start_time=0.0, end_time=sum(busy), num_prefill_tokens=tokens,
                               num_decode_tokens=4, num_prefill_seqs=int(tokens > 0), num_decode_seqs=4,
                               prefill_attention_work=tokens * tokens, decode_context_tokens=400,
                               num_preemptions=0, num_kv_blocks_used=0, num_waiting=0, num_running=4,
                               stage_busy_s=busy, stage_idle_s=[0.0, 0.0]))
    return out


def test_each_stage_is_fitted_on_its_own_busy_seconds(tmp_path):
    models = StageCostModels.fit(records())
    for stage, model in enumerate(models.stages):
        for record in records(12):
            assert model.predict(IterationFeatures.of(record)) == pytest.approx(record.stage_busy_s[stage], rel=1e-6)
    models.save(tmp_path / "stages.json")
    assert StageCostModels.load(tmp_path / "stages.json") == models
    with pytest.raises(ValueError, match="one pipeline"):
        StageCostModels.fit([dataclasses.replace(r, stage_busy_s=[]) for r in records()])


def test_each_stage_draws_its_hand_off_from_the_fitted_runs():
    """Stage 1 took 1 ms to take three micro-batches in four, 9 ms the fourth; stage 0 never waits. The
    simulated stage 1 starts a micro-batch that long after stage 0 and it were both done, and says so."""
    handed_off = [dataclasses.replace(r, stage_handoff_s=[0.0, 0.009 if r.iteration % 4 == 3 else 0.001])
                  for r in records()]
    models = StageCostModels.fit(handed_off)
    assert models.handoff_quantiles_s[0] == [0.0] * len(models.handoff_quantiles_s[0])
    quantiles = models.handoff_quantiles_s[1]
    assert (min(quantiles), statistics.median(quantiles), max(quantiles)) == (0.001, 0.001, 0.009)
    assert not StageCostModels.fit(records()).handoff_quantiles_s  # records without hand-offs: none charged
    clock = VirtualClock()
    runner = FittedPipelineRunner(models, 64, {2}, seed=0, clock=clock)
    decode = micro_batch("decode", 0)
    stage_0, stage_1 = (m.predict(IterationFeatures.of(decode)) for m in models.stages)
    handoffs = []
    for _ in range(40):
        runner.submit(decode, clock())
        assert runner.wait()
        [seen] = runner.pop_finished(clock())
        handoffs.append(round(seen.result.stage_handoff_s[1], 6))  # on the clock's grid
        assert seen.result.stage_handoff_s[0] == 0.0
        assert seen.end_s - seen.start_s == pytest.approx(stage_0 + handoffs[-1] + stage_1)
    assert set(handoffs) <= set(quantiles) and min(handoffs) == 0.001 and max(handoffs) > 0.005


def prefill_seconds(tokens: int) -> float:
    """Superlinear in the prompt, with no attention work recorded: a cost the features cannot express."""
    return 0.03 + 1e-3 * tokens + 3e-7 * tokens * tokens


def test_stage_models_fit_the_relative_error_so_short_stages_are_not_lost_to_long_prefills():
    prefills = [dataclasses.replace(r, num_prefill_tokens=128 * (1 + r.iteration % 16), num_decode_tokens=0,
                                    num_decode_seqs=0, prefill_attention_work=0, decode_context_tokens=0,
                                    stage_busy_s=[prefill_seconds(128 * (1 + r.iteration % 16))] * 2)
                for r in records(48)]
    short = IterationFeatures(128, 0, 0, 0)
    absolute = CostModel.fit([dataclasses.replace(r, end_time=r.stage_busy_s[0]) for r in prefills])
    models = StageCostModels.fit(prefills)
    assert absolute.predict(short) < 0.5 * prefill_seconds(128)  # the 2,048-token prefills set the line
    for model in models.stages:
        assert model.fitted_on["least_squares"] == "relative"
        assert model.predict(short) == pytest.approx(prefill_seconds(128), rel=0.15)


def micro_batch(request_id: str, prefill_tokens: int) -> SchedulerOutput:
    """One request's prefill of ``prefill_tokens``, or with 0 its decode."""
    tokens = list(range(prefill_tokens or 1))
    return SchedulerOutput([ScheduledUnit(request_id, tokens, 0 if prefill_tokens else 50, prefill_tokens > 0, True,
                                          [0], SamplingParams())])


def test_tokens_are_stamped_when_the_engine_sees_them_after_its_stage_0_forward():
    """As in the real pipeline, whose engine process runs stage 0: a decode that leaves stage 1 while stage 0 works
    on a long prefill reaches the engine (and its request) when that prefill's stage-0 forward is done."""
    clock, models = VirtualClock(), StageCostModels.fit(records())  # exact: every residual is 0
    runner = FittedPipelineRunner(models, 64, {2}, seed=0, clock=clock)
    decode, prefill = micro_batch("decode", 0), micro_batch("prefill", 1000)
    (decode_0, decode_1), (prefill_0, prefill_1) = ([m.predict(IterationFeatures.of(out)) for m in models.stages]
                                                    for out in (decode, prefill))
    assert decode_0 + decode_1 < decode_0 + prefill_0  # the decode leaves stage 1 during the prefill's stage 0
    runner.submit(decode, clock())
    runner.submit(prefill, clock())
    stage_0_free = clock()
    assert stage_0_free == pytest.approx(decode_0 + prefill_0)
    [seen] = runner.pop_finished(stage_0_free)
    assert seen.output is decode and seen.result.stage_busy_s == pytest.approx([decode_0, decode_1])
    assert seen.end_s == stage_0_free  # not decode_0 + decode_1, when it left stage 1
    assert runner.wait()
    [seen] = runner.pop_finished(clock())
    assert seen.output is prefill and seen.end_s == clock() == pytest.approx(decode_0 + prefill_0 + prefill_1)


def simulated(path, policy: str, pp: int = 2, clock: str = "virtual") -> LLMEngine:
    return LLMEngine.from_kwargs(model="tiny", runner="simulated", clock=clock, cost_model=str(path),
                                 pipeline_parallel_size=pp, scheduler=policy, chunk_size=64)


@pytest.mark.parametrize("policy", ["sarathi", "vllm"])
def test_the_simulated_pipeline_runs_the_engines_schedulers(tmp_path, policy):
    path = tmp_path / "stages.json"
    StageCostModels.fit(records()).save(path)
    engine = simulated(path, policy)
    for i in range(12):
        engine.add_request(list(range(3, 100 + 10 * i)), SamplingParams(max_tokens=20, ignore_eos=True),
                           arrival_time=0.01 * i)
    finished = {}
    while engine.has_unfinished():
        finished |= {out.request_id: out for out in engine.step() if out.finished}
    assert len(finished) == 12 and all(len(out.token_ids) == 20 for out in finished.values())
    batches = engine.batch_records
    assert all(len(r.stage_busy_s) == 2 for r in batches)
    assert sum(b.start_time < a.end_time for a, b in zip(batches, batches[1:], strict=False)) > len(batches) / 2


def test_a_simulated_pipeline_needs_its_stage_models_and_the_virtual_clock(tmp_path):
    path = tmp_path / "stages.json"
    StageCostModels.fit(records()).save(path)
    with pytest.raises(ConfigError, match="model.clock must be virtual"):
        simulated(path, "sarathi", clock="real")
    with pytest.raises(ConfigError, match="pipeline_parallel_size must be 2, the stages of"):
        simulated(path, "sarathi", pp=3)  # tiny has 2 layers, but the models say 2 stages first
