"""The speed check: a cost model rescaled, per iteration kind, to how fast the real runner runs now."""
import dataclasses
import random

import pytest

from stallfree.engine import LLMEngine, check_speed
from stallfree.engine.simulator.fitting.cost_model import CostModel, IterationFeatures
from stallfree.engine.simulator.fitting.speed_check import MIN_KIND_ITERATIONS, measure_speed
from tests.engine.simulator.test_simulated_runner import record
from tests.helpers.engine import FIXED

DECODE = IterationFeatures(0, 16, 0, 16 * 300)
PREFILL = IterationFeatures(256, 0, 256 * 512, 0)


def test_rescaled_scales_each_kind_and_composes(tmp_path):
    once = FIXED.rescaled({"decode": 1.2, "prefill": 0.9}, {"why": "test"})
    assert once.predict(DECODE) == pytest.approx(1.2 * FIXED.predict(DECODE))
    assert once.predict(PREFILL) == pytest.approx(0.9 * FIXED.predict(PREFILL))
    twice = once.rescaled({"decode": 1.1}, {})
    assert twice.predict(DECODE) == pytest.approx(1.32 * FIXED.predict(DECODE))
    assert twice.predict(PREFILL) == pytest.approx(once.predict(PREFILL))
    assert FIXED.speed_factors == {} and once.fitted_on["speed_check"] == {"why": "test"}
    once.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").predict(DECODE) == pytest.approx(once.predict(DECODE))


def test_sampling_a_rescaled_model_keeps_its_residual_buckets():
    """Buckets are bounds on fitted time: a slower machine draws from the same bucket, scaled."""
    model = dataclasses.replace(FIXED, residual_quantiles={"decode": [[1.0], [2.0]], "prefill": [[1.0]]},
                                residual_bounds_s={"decode": [FIXED.predict(DECODE) * 1.1], "prefill": []})
    slower = model.rescaled({"decode": 1.5}, {})
    assert model.sample(DECODE, random.Random(0)) == pytest.approx(model.predict(DECODE))
    assert slower.sample(DECODE, random.Random(0)) == pytest.approx(1.5 * model.predict(DECODE))


def test_measure_speed_is_the_median_ratio_per_kind_and_needs_enough_iterations():
    decodes = [record(0, 8, 0, 8 * 200, 0.0) for _ in range(9)]
    seconds = [FIXED.predict(IterationFeatures.of(r)) * ratio for r, ratio in
               zip(decodes, [1.1, 1.2, 1.2, 1.25, 1.3, 1.3, 1.3, 2.0, 9.0], strict=True)]
    decodes = [dataclasses.replace(r, end_time=r.start_time + s) for r, s in zip(decodes, seconds, strict=True)]
    prefills = [record(128, 0, 128 * 128, 0, 1.0)] * (MIN_KIND_ITERATIONS - 1)
    check = measure_speed(decodes + prefills, FIXED)
    assert check.factors == {"decode": pytest.approx(1.3), "prefill": 1.0, "hybrid": 1.0}
    assert check.num_iterations == {"decode": 9, "prefill": MIN_KIND_ITERATIONS - 1, "hybrid": 0}


def test_check_speed_measures_the_real_runner_against_the_model():
    """A model that predicts half the true time gets about twice the factors of the same model at the true scale."""
    engine = LLMEngine.from_kwargs(model="tiny")
    first = check_speed(engine, FIXED)
    halved = CostModel(coefficients={k: v / 2 for k, v in FIXED.coefficients.items()})
    second = check_speed(engine, halved)
    measured = [kind for kind, n in first.num_iterations.items() if n >= MIN_KIND_ITERATIONS]
    assert {"decode", "hybrid"} <= set(measured)  # the default policy, sarathi, runs no prefill-only iteration but its first
    assert not engine.has_unfinished()
    for kind in measured:
        assert 1.3 < second.factors[kind] / first.factors[kind] < 3.0  # 2x, with room for a busy machine
