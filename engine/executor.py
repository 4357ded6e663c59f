"""The executor (vLLM's word): what the engine steps, from its config. The runner of one process (stepped as a
``SerialRunner`` of depth 1), with ``tensor_parallel_size`` x ``pipeline_parallel_size`` > 1 the distributed
runner of several (engine/distributed/, imported only then), or a real pipeline simulated on stage cost models
fitted on it (engine/simulator/fitted_pipeline.py). A simulated GPU deployment is built apart, from its shape
(engine/simulator/build.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stallfree.engine.config import EngineConfig
from stallfree.engine.config_checks import require
from stallfree.engine.fitting.cost_model import CostModel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.runner.base import BatchRunner
from stallfree.engine.runner.clock import Clock, VirtualClock
from stallfree.engine.runner.factory import RUNNERS, RunnerSetup
from stallfree.engine.runner.kv_sizing import blocks_for_budget
from stallfree.engine.runner.serial import SerialRunner
from stallfree.engine.simulator.fitted_pipeline import FittedPipelineRunner, StageCostModels


def make_executor(config: EngineConfig, path: Path, arch: ArchConfig, max_model_len: int, dtype: torch.dtype,
                  device: torch.device, eos_token_ids: set[int], cost_model: CostModel | None
                  ) -> tuple[Any, BatchRunner, Clock, int]:
    """The runner of ``config`` (it holds ``num_blocks`` where it sized the KV cache), the BatchRunner the
    engine steps, the clock, and the KV blocks the engine may use."""
    mc, cc = config.model, config.cache
    # On CUDA the model runner sizes the KV cache from measured memory (engine/runner/kv_sizing.py).
    sized_by_runner = device.type == "cuda" and mc.runner == "model" and not cc.num_blocks
    num_blocks = cc.num_blocks or (None if sized_by_runner else blocks_for_budget(arch, cc, config.parallel, dtype))
    setup = RunnerSetup(config, path, arch, max_model_len, num_blocks, dtype, device, eos_token_ids, cost_model)
    if mc.runner == "simulated" and config.parallel.pipeline_parallel_size > 1:
        runner, batches, clock = simulated_pipeline(setup)
    elif config.parallel.world_size > 1:
        from stallfree.engine.distributed.distributed_runner import start_driver

        runner, batches, clock = start_driver(setup)
    else:
        runner, clock = RUNNERS[mc.runner](setup)
        batches = SerialRunner(runner, clock)
    return runner, batches, clock, num_blocks or runner.num_blocks


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
