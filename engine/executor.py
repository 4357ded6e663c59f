"""The executor (vLLM's word): the runner of one process, or with ``tensor_parallel_size`` x
``pipeline_parallel_size`` > 1 the distributed runner of several (engine/distributed/, imported only then)."""
from __future__ import annotations

from pathlib import Path

import torch

from stallfree.engine.config import EngineConfig
from stallfree.engine.fitting.cost_model import CostModel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.runner.base import Runner
from stallfree.engine.runner.clock import Clock
from stallfree.engine.runner.factory import RUNNERS, RunnerSetup
from stallfree.engine.runner.kv_sizing import blocks_for_budget


def make_executor(config: EngineConfig, path: Path, arch: ArchConfig, max_model_len: int, dtype: torch.dtype,
                  device: torch.device, eos_token_ids: set[int], cost_model: CostModel | None
                  ) -> tuple[Runner, Clock, int]:
    """The runner and clock of ``config``, and the KV blocks the engine may use."""
    mc, cc = config.model, config.cache
    # On CUDA the model runner sizes the KV cache from measured memory (engine/runner/kv_sizing.py).
    sized_by_runner = device.type == "cuda" and mc.runner == "model" and not cc.num_blocks
    num_blocks = cc.num_blocks or (None if sized_by_runner else blocks_for_budget(arch, cc, config.parallel, dtype))
    setup = RunnerSetup(config, path, arch, max_model_len, num_blocks, dtype, device, eos_token_ids, cost_model)
    if config.parallel.world_size > 1:
        from stallfree.engine.distributed.distributed_runner import start_driver

        runner, clock = start_driver(setup)
    else:
        runner, clock = RUNNERS[mc.runner](setup)
    return runner, clock, num_blocks or runner.num_blocks
