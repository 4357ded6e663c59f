"""A speed check: how fast the real runner runs now against a cost model's predictions, in a few seconds.

A CPU VM's speed drifts by 5-10% within tens of minutes (docs/performance.md), so a cost model profiled
an hour before a run can be off by more than the simulator's error budget. The check runs a short, fixed
mix of requests (a burst, then lone arrivals beside the decodes, as the profile does) on a real engine
and measures actual / predicted time of its iterations, per iteration kind. ``CostModel.rescaled`` applies
the factors. It measures iterations, not a run's latencies: the run a simulation is checked against stays
out of its inputs.
"""
from __future__ import annotations

import datetime
import random
import statistics
from dataclasses import dataclass

from stallfree.engine.records import BatchRecord
from stallfree.engine.simulator.fitting.cost_model import (
    RESIDUAL_KINDS,
    CostModel,
    IterationFeatures,
    iteration_kind,
)
from stallfree.engine.simulator.fitting.profile import (
    STAGGER_STEPS,
    WARMUP_ITERATIONS,
    ProfiledEngine,
    feed_requests,
    random_requests,
)

CHECK_REQUESTS = 12  # about 60 decode and 12 prefill iterations: ~2-4 s of `small` on a 2-core CPU
MIN_KIND_ITERATIONS = 5  # fewer iterations of a kind leave its factor at 1


@dataclass(frozen=True)
class SpeedCheck:
    factors: dict[str, float]  # per kind: median actual / predicted iteration time
    num_iterations: dict[str, int]  # per kind, the iterations measured

    def describe(self) -> dict:
        return {"factors": self.factors, "num_iterations": self.num_iterations,
                "date": datetime.datetime.now().isoformat(timespec="seconds")}


def check_speed(engine: ProfiledEngine, model: CostModel, *, num_requests: int = CHECK_REQUESTS,
                seed: int = 0) -> SpeedCheck:
    """Run the check's requests on ``engine`` (which must be idle) and compare its iterations with
    ``model``. The engine's batch records keep the check's iterations; callers that replay next count
    from where they stand."""
    first = len(engine.batch_records) + WARMUP_ITERATIONS
    requests = random_requests(random.Random(seed), num_requests, engine, max_prompt=512, max_output=32)
    half = num_requests // 2
    for stagger_steps, part in ((0, requests[:half]), (STAGGER_STEPS, requests[half:])):
        feed_requests(engine, part, stagger_steps)
    return measure_speed(engine.batch_records[first:], model)


def measure_speed(records: list[BatchRecord], model: CostModel) -> SpeedCheck:
    """Per kind, the median actual / predicted time of ``records`` (1 for a kind with too few)."""
    ratios: dict[str, list[float]] = {kind: [] for kind in RESIDUAL_KINDS}
    for record in records:
        features = IterationFeatures.of(record)
        if (predicted := model.predict(features)) > 0:
            ratios[iteration_kind(features)].append((record.end_time - record.start_time) / predicted)
    return SpeedCheck(factors={kind: round(statistics.median(r), 4) if len(r) >= MIN_KIND_ITERATIONS else 1.0
                               for kind, r in ratios.items()},
                      num_iterations={kind: len(r) for kind, r in ratios.items()})
