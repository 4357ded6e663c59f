"""From an engine config to what the engine steps: the runner, the ``BatchRunner`` over it (engine/runner/base.py)
and the clock. One runner in this process (a ``SerialRunner`` of depth 1), worker processes for tensor or
pipeline parallelism (engine/distributed/, imported only then), or a real pipeline simulated on stage cost
models fitted on it (engine/simulator/fitted_pipeline.py). A simulated GPU deployment is built apart, from
its shape (engine/simulator/build.py)."""
from __future__ import annotations

from typing import Any

from stallfree.engine.hydra_groups import require
from stallfree.engine.runner.base import BatchRunner
from stallfree.engine.runner.clock import Clock, VirtualClock
from stallfree.engine.runner.factory import RUNNERS, RunnerSetup
from stallfree.engine.runner.serial import SerialRunner
from stallfree.engine.simulator.fitted_pipeline import FittedPipelineRunner, StageCostModels


def build_runners(setup: RunnerSetup) -> tuple[Any, BatchRunner, Clock]:
    """(the runner, which holds ``num_blocks`` where it sized the KV cache; the BatchRunner; the clock)."""
    config, mc = setup.config, setup.config.model
    if mc.runner == "simulated" and config.parallel.pipeline_parallel_size > 1:
        return simulated_pipeline(setup)
    if config.parallel.world_size > 1:
        from stallfree.engine.distributed.driver import start_driver

        return start_driver(setup)
    runner, clock = RUNNERS[mc.runner](setup)
    return runner, SerialRunner(runner, clock), clock


def simulated_pipeline(setup: RunnerSetup) -> tuple[FittedPipelineRunner, FittedPipelineRunner, VirtualClock]:
    mc, pp = setup.config.model, setup.config.parallel.pipeline_parallel_size
    require(mc.clock == "virtual", "model.clock", "virtual for a simulated pipeline (pipeline_parallel_size > 1)",
            mc.clock)
    require(mc.cost_model is not None, "model.cost_model",
            "stage cost models fitted on a real pipeline (benchmarks/pipeline_fidelity.py) for a simulated one",
            mc.cost_model)
    models = StageCostModels.load(mc.cost_model)
    require(len(models.stages) == pp, "pipeline_parallel_size", f"{len(models.stages)}, the stages of "
            f"{mc.cost_model}", pp)
    clock = VirtualClock()
    runner = FittedPipelineRunner(models, setup.arch.vocab_size, setup.eos_token_ids, mc.seed, clock)
    return runner, runner, clock
