"""A real pipeline deployment simulated: each stage's busy time on a micro-batch from a cost model fitted on
that stage's busy seconds in a real pipelined run (the ``stage_busy_s`` of its BatchRecords), and its time to
take each micro-batch drawn from that run's hand-offs (``stage_handoff_s``).

``StageCostModels`` is one ``CostModel`` (engine/simulator/fitting/cost_model.py) and one hand-off distribution per
stage, saved as one JSON file; an engine with ``model.runner=simulated``, ``model.clock=virtual``,
``pipeline_parallel_size=PP`` and ``model.cost_model`` naming such a file runs the same schedulers over a
``FittedPipelineRunner`` of PP stages.
"""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from stallfree.engine.records import BatchRecord
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.fitting.cost_model import (
    CostModel,
    IterationFeatures,
    evenly_spaced_quantiles,
)
from stallfree.engine.simulator.simulated_pipeline import SimulatedPipeline


def stage_records(records: list[BatchRecord], stage: int) -> list[BatchRecord]:
    """``records`` timed by stage ``stage``'s busy seconds alone: what that stage's cost model fits and predicts."""
    return [dataclasses.replace(r, start_time=0.0, end_time=r.stage_busy_s[stage]) for r in records]


@dataclass
class StageCostModels:
    stages: list[CostModel]
    fitted_on: dict = field(default_factory=dict)
    # each stage's hand-off seconds over the fitted micro-batches, at evenly spaced quantiles (0 on stage 0,
    # whose engine step its busy time holds); empty: none charged (records from before hand-offs were timed)
    handoff_quantiles_s: list[list[float]] = field(default_factory=list)

    @classmethod
    def fit(cls, records: list[BatchRecord], *, seed: int = 0, fitted_on: dict | None = None) -> StageCostModels:
        """One cost model per stage, fitted on each record's busy seconds in that stage, by least squares of the
        relative error: on absolute seconds the whole-prompt prefills (seconds long) set the intercept, and the
        short decode stages of a PP2 run of ``small`` ran at 0.42-0.80x of the prediction (docs/performance.md,
        Pipeline fidelity)."""
        stage_counts = {len(r.stage_busy_s) for r in records}
        if len(stage_counts) != 1 or 0 in stage_counts:
            raise ValueError(f"fitting stage cost models needs records of one pipeline, got stage counts {stage_counts}")
        num_stages = stage_counts.pop()
        stages = [CostModel.fit(stage_records(records, stage), seed=seed, fitted_on=fitted_on, relative=True)
                  for stage in range(num_stages)]
        timed = [r.stage_handoff_s for r in records if len(r.stage_handoff_s) == num_stages]
        handoffs = [evenly_spaced_quantiles([h[stage] for h in timed], 6) for stage in range(num_stages)] \
            if len(timed) == len(records) else []
        return cls(stages, fitted_on or {}, handoffs)

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> StageCostModels:
        try:
            data = json.loads(Path(path).read_text())
            return cls([CostModel(**stage) for stage in data["stages"]], data.get("fitted_on", {}),
                       data.get("handoff_quantiles_s", []))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"model.cost_model: cannot read stage cost models from {path}: {exc}") from exc


class FittedPipelineRunner(SimulatedPipeline):
    """Stage i takes what its cost model draws for the micro-batch (its residual spread included), and to take
    it a hand-off drawn from the fitted run's; nothing more is charged for sends, which a real run counts as
    the next stage's idle time. Tokens are stamped when the engine pops their micro-batch, as the real
    pipeline's are: its engine process runs stage 0, and a result that came back during a stage-0 forward is
    seen after it (up to a whole-prompt prefill later)."""

    def __init__(self, models: StageCostModels, vocab_size: int, eos_token_ids: set[int], seed: int,
                 clock: VirtualClock):
        super().__init__(len(models.stages), len(models.stages), clock, stamped_when_popped=True)
        self.models, self.rng = models, random.Random(seed)
        # Sampled ids avoid EOS, so every request runs to its max_tokens, as in engine/simulator/simulated_runner.py.
        self.token_ids = [t for t in range(vocab_size) if t not in eos_token_ids]

    def stage_seconds(self, output: SchedulerOutput) -> tuple[list[float], float]:
        features = IterationFeatures.of(output)
        return [model.sample(features, self.rng) for model in self.models.stages], 0.0

    def handoff_seconds(self) -> list[float] | None:
        quantiles = self.models.handoff_quantiles_s
        return [self.rng.choice(stage) for stage in quantiles] if quantiles else None

    def sample(self, output: SchedulerOutput) -> dict[str, int]:
        token_ids, randrange = self.token_ids, self.rng.randrange
        return {u.request_id: token_ids[randrange(len(token_ids))] for u in output.units if u.samples}
