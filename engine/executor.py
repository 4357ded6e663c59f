"""The executor (vLLM's word): what the engine steps, chosen from its config here and nowhere else.

* ``model.runner=model``: the model runner of one process (stepped as a ``SerialRunner`` of depth 1), or with
  ``tensor_parallel_size`` x ``pipeline_parallel_size`` > 1 the distributed runner of several
  (engine/distributed/, imported only then);
* ``model.runner=simulated``: a cost model's runner (engine/simulator/simulated_runner.py), a real pipeline
  simulated on stage cost models fitted on it (engine/simulator/fitted_pipeline.py), or a GPU deployment
  simulated from its shape (engine/simulator/deployment_runner.py).

Nothing here profiles: a simulated runner gets its cost model resolved before the engine is built
(engine/simulator/fitting/profile.py:resolve_cost_model)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stallfree.engine.config import EngineConfig
from stallfree.engine.config_checks import require
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.registry import Registry
from stallfree.engine.runner.base import BatchRunner
from stallfree.engine.runner.clock import CLOCKS, Clock, VirtualClock, WallClock
from stallfree.engine.runner.factory import RunnerSetup, build_model_runner
from stallfree.engine.runner.kv_sizing import blocks_for_budget
from stallfree.engine.runner.serial import SerialRunner
from stallfree.engine.simulator.build import Simulation
from stallfree.engine.simulator.deployment_runner import DeploymentRunner
from stallfree.engine.simulator.fitted_pipeline import FittedPipelineRunner, StageCostModels
from stallfree.engine.simulator.fitting.cost_model import CostModel
from stallfree.engine.simulator.simulated_runner import SimulatedRunner

# runner, the BatchRunner the engine steps, clock
Executor = tuple[Any, BatchRunner, Clock]
RUNNERS: Registry[Callable[[RunnerSetup, CostModel | None], Executor]] = Registry("model.runner")


def make_executor(config: EngineConfig, path: Path | None, arch: ArchConfig, max_model_len: int, dtype: torch.dtype,
                  device: torch.device, eos_token_ids: set[int], cost_model: CostModel | None,
                  simulation: Simulation | None = None) -> tuple[Any, BatchRunner, Clock, int]:
    """The runner of ``config`` (it holds ``num_blocks`` where it sized the KV cache), the BatchRunner the
    engine steps, the clock, and the KV blocks the engine may use."""
    mc, cc = config.model, config.cache
    if simulation is not None:  # a simulated GPU deployment: its memory plan sizes the KV cache
        clock = VirtualClock()
        runner = DeploymentRunner(simulation.deployment, simulation.resolved, mc.seed, clock, mc.op_split_every)
        return runner, runner, clock, cc.num_blocks or simulation.memory.num_blocks
    # On CUDA the model runner sizes the KV cache from measured memory (engine/runner/kv_sizing.py).
    sized_by_runner = device.type == "cuda" and mc.runner == "model" and not cc.num_blocks
    num_blocks = cc.num_blocks or (None if sized_by_runner else blocks_for_budget(arch, cc, config.parallel, dtype))
    setup = RunnerSetup(config, path, arch, max_model_len, num_blocks, dtype, device, eos_token_ids)
    runner, batches, clock = RUNNERS[mc.runner](setup, cost_model)
    return runner, batches, clock, num_blocks or runner.num_blocks


@RUNNERS.register("model")
def model_executor(setup: RunnerSetup, _cost_model: CostModel | None) -> Executor:
    if setup.config.parallel.world_size > 1:
        from stallfree.engine.distributed.distributed_runner import start_driver

        return start_driver(setup)
    runner, clock = build_model_runner(setup), WallClock()
    return runner, SerialRunner(runner, clock), clock


@RUNNERS.register("simulated")
def simulated_executor(setup: RunnerSetup, cost_model: CostModel | None) -> Executor:
    mc, parallel = setup.config.model, setup.config.parallel
    if parallel.pipeline_parallel_size > 1:
        return simulated_pipeline(setup)
    require(parallel.tensor_parallel_size == 1, "parallel.tensor_parallel_size",
            "1 for runner=simulated (a GPU deployment's tensor parallelism is simulated with model.deployment)",
            parallel.tensor_parallel_size)
    clock = CLOCKS[mc.clock]()
    require(cost_model is not None, "model.cost_model",
            "set for runner=simulated, or the engine built with LLMEngine.from_config (which profiles one)", None)
    virtual = clock if isinstance(clock, VirtualClock) else None  # without one the runner sleeps
    runner = SimulatedRunner(cost_model, setup.arch.vocab_size, setup.eos_token_ids, virtual, mc.seed)
    return runner, SerialRunner(runner, clock), clock


def simulated_pipeline(setup: RunnerSetup) -> Executor:
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
