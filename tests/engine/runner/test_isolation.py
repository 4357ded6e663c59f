"""No request can hurt another in the engine: every parameter is checked against its range before a
request is queued, and a step that still fails ends only the requests it fails on; the others produce
exactly the tokens of a run without them (greedy)."""
from __future__ import annotations

import math

import pytest

from stallfree.engine import LLM, LLMEngine, SamplingParams
from stallfree.engine.request_limits import INT64_MAX, INT64_MIN, RANGES
from stallfree.engine.runner.isolation import execute_isolating
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput
from tests.helpers.engine import make_prompts
from tests.helpers.fakes.poisoned_runner import POISON_SEED, PoisonedRunner

HUGE = int("9" * 4300)  # the top_k: the largest integer Python's JSON decoder reads

BAD_PARAMS = [
    ("max_tokens", 0), ("max_tokens", 2**63), ("max_tokens", True), ("max_tokens", 2.0), ("max_tokens", "8"),
    ("temperature", -1e-9), ("temperature", 2.5), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", HUGE), ("temperature", None),
    ("top_p", 0), ("top_p", 1.0000001), ("top_p", math.nan), ("top_p", -math.inf),
    ("top_k", -2), ("top_k", HUGE), ("top_k", 2**63), ("top_k", 1.5), ("top_k", False),
    ("seed", 2**64), ("seed", INT64_MIN - 1), ("seed", HUGE), ("seed", 1.0),
    ("ignore_eos", 1), ("stop_token_ids", [-1]), ("stop_token_ids", [2**63]), ("stop_token_ids", [1.0]),
    ("stop_token_ids", list(range(65))), ("stop_token_ids", "12"),
]


@pytest.fixture(scope="module")
def llm(tiny_path):
    return LLM(str(tiny_path), dtype="float32", scheduler="sarathi", chunk_size=64, max_model_len=256)


@pytest.mark.parametrize(("name", "value"), BAD_PARAMS)
def test_every_out_of_range_parameter_is_a_value_error_naming_it(llm, name, value):
    with pytest.raises(ValueError, match=f"^{name} must be") as info:
        llm.generate([[5, 6, 7], [8, 9]], [SamplingParams(max_tokens=2), SamplingParams(**{name: value})])
    assert len(str(info.value)) < 200  # a 4,300-digit integer is described, not printed
    assert not llm.engine.has_unfinished()  # the call queued nothing, not even its good first prompt


def test_the_edges_of_every_range_are_accepted(llm):
    edges = [SamplingParams(max_tokens=1, temperature=2, top_p=1e-300, top_k=INT64_MAX, seed=INT64_MIN),
             SamplingParams(max_tokens=INT64_MAX, temperature=1e-300, top_k=-1, seed=2**64 - 1,
                            stop_token_ids=list(range(64))),
             SamplingParams(max_tokens=3, temperature=0.7, top_p=1e-300, top_k=0, seed=0)]
    outs = llm.generate([[5, 6, 7]] * 3, edges)
    assert [o.finish_reason for o in outs] in (["length", "length", "length"], ["length", "stop", "length"])
    assert all(0 <= t < 2048 for o in outs for t in o.token_ids)
    # a temperature too small for float32 is greedy, as vLLM takes it (it once sampled NaN: token 0)
    greedy = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    tiny_t = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=1e-30, ignore_eos=True))[0]
    assert tiny_t.token_ids == greedy.token_ids


def test_ranges_describe_themselves():
    assert RANGES["top_k"].describe() == "an integer in [-1, 2^63-1]"
    assert RANGES["top_p"].describe() == "a number in (0, 1]"
    assert RANGES["n"].describe() == "1"


# -- a step that fails on some requests ------------------------------------------------------------


def greedy(max_tokens: int, seed: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, seed=seed)


def run(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]], gap: int = 2):
    """Add request i at iteration i * gap; step to the end. {request id: final output}."""
    outputs, pending, iteration = {}, list(enumerate(requests)), 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] * gap <= iteration:
            _, (rid, prompt, params) = pending.pop(0)
            engine.add_request(prompt, params, request_id=rid)
        outputs |= {o.request_id: o for o in engine.step() if o.finished}
        iteration += 1
    return outputs


def run_with(engine: LLMEngine, runner, requests) -> dict:
    """``run`` with ``runner`` in place of the engine's own (None: its own)."""
    real = engine.batches.runner
    engine.batches.runner = runner or real
    try:
        return run(engine, requests)
    finally:
        engine.batches.runner = real


@pytest.fixture(scope="module")
def engine(tiny_path):
    return LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32", scheduler="sarathi", chunk_size=64)


@pytest.fixture(scope="module")
def workload(engine):
    """Eight greedy requests and their tokens in a run of their own."""
    good = [(f"good{i}", p, greedy(12 + i)) for i, p in enumerate(make_prompts(8, seed=3, max_len=150))]
    return good, {rid: o.token_ids for rid, o in run_with(engine, None, good).items()}


@pytest.mark.parametrize("after_tokens", [0, 70, 160])  # first prefill chunk, a later chunk, mid-decode
def test_a_step_that_fails_on_one_request_ends_only_it(engine, workload, after_tokens):
    good, clean = workload
    bad = [(f"bad{i}", [9, 10, 11] * 50, greedy(20, seed=POISON_SEED)) for i in range(3)]
    runner = PoisonedRunner(engine.runner, after_tokens=after_tokens)
    steps = len(engine.batch_records)
    outputs = run_with(engine, runner, [good[0], bad[0], *good[1:4], bad[1], *good[4:], bad[2]])
    assert {rid: outputs[rid].token_ids for rid, _, _ in good} == clean  # token for token
    for rid, _, _ in bad:
        out = outputs[rid]
        assert out.finish_reason == "error" and f"Poisoned: poisoned request {rid} at token" in out.error
        assert len(out.token_ids) == max(0, after_tokens - 150 + 1)
    assert runner.calls > len(engine.batch_records) - steps  # it re-ran failed steps
    assert not engine.has_unfinished() and engine.num_free_blocks == engine.num_total_blocks


def test_an_overflow_in_the_real_sampler_fails_only_its_request(engine, workload):
    """The reported fault's kind, in process: values too large for a float set on queued requests'
    params (past validation). The issue's top_k no longer reaches the knob tensor (the sampler clamps it
    to the vocabulary); a temperature that large still raises OverflowError in the sampler."""
    good, clean = workload
    odd_top_k, overflow = (SamplingParams(max_tokens=20, temperature=0.7, ignore_eos=True) for _ in range(2))
    engine.add_request([9, 10, 11] * 20, odd_top_k, request_id="top_k")
    engine.add_request([9, 10, 11] * 20, overflow, request_id="overflow")
    odd_top_k.top_k, overflow.temperature = HUGE, HUGE
    outputs = run(engine, good)
    assert {rid: outputs[rid].token_ids for rid, _, _ in good} == clean
    assert outputs["top_k"].finish_reason == "length"
    assert outputs["overflow"].finish_reason == "error" and "OverflowError" in outputs["overflow"].error
    assert engine.num_free_blocks == engine.num_total_blocks


def test_a_fault_that_is_no_requests_fails_them_all_and_the_engine_goes_on(engine, workload):
    good, clean = workload

    class Broken:
        reads_block_tables, computes_logits = True, True

        def execute_model(self, output):
            raise RuntimeError("device lost")

    outputs = run_with(engine, Broken(), good[:3])
    assert [(o.finish_reason, o.error) for o in outputs.values()] == [("error", "RuntimeError: device lost")] * 3
    assert engine.num_free_blocks == engine.num_total_blocks
    assert {rid: o.token_ids for rid, o in run_with(engine, None, good).items()} == clean


def test_bisection_finds_exactly_the_failing_units_in_few_runs():
    units = [ScheduledUnit(f"r{i}", [1], 0, True, True, [0], SamplingParams()) for i in range(64)]
    bad = {"r5", "r40"}
    calls = []

    class Runner:
        def execute_model(self, output):
            calls.append(len(output.units))
            if found := sorted(bad & {u.request_id for u in output.units}):
                raise ValueError("bad: " + ",".join(found))
            return ModelRunnerOutput({u.request_id: 7 for u in output.units})

    sampled, failed = execute_isolating(Runner(), SchedulerOutput(units), ValueError("first"))
    assert set(failed) == bad and str(failed["r5"]) == "bad: r5" and str(failed["r40"]) == "bad: r40"
    assert sampled.sampled_token_ids == {f"r{i}": 7 for i in range(64) if f"r{i}" not in bad}
    assert len(calls) <= 2 * len(bad) * 6  # 2 k log2(n)


def test_the_simulated_runner_is_isolated_too(tmp_path):
    from tests.helpers.engine import FIXED

    FIXED.save(tmp_path / "cost.json")
    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual",
                                   cost_model=str(tmp_path / "cost.json"), scheduler="vllm")
    requests = [(f"r{i}", [5 + i] * (10 + 7 * i), greedy(5 + i)) for i in range(12)]
    runner = PoisonedRunner(engine.runner, request_ids={"r3", "r8"})
    outputs = run_with(engine, runner, requests)
    assert {rid: o.finish_reason for rid, o in outputs.items()} == {
        f"r{i}": "error" if i in (3, 8) else "length" for i in range(12)}
    assert all(len(outputs[rid].token_ids) == p.max_tokens for rid, _, p in requests if rid not in ("r3", "r8"))
    assert engine.num_free_blocks == engine.num_total_blocks


def test_the_inprocess_load_generator_records_the_failed_request_alone(engine):
    from stallfree.loadgen.targets.inprocess import replay
    from stallfree.loadgen.workload.request_specs import build_workload

    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 16, "output": 8}, 4, 0, 1000)
    real = engine.batches.runner
    engine.batches.runner = PoisonedRunner(real, request_ids={specs[1].request_id})
    try:
        records = replay(engine, specs).records
    finally:
        engine.batches.runner = real
    assert [(r.status, r.output_tokens) for r in records] == [("ok", 8), ("error", 0), ("ok", 8), ("ok", 8)]
    assert "failed in the engine: Poisoned: poisoned request" in records[1].error
