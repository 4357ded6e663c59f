"""Build the runner and clock that ``model.runner`` / ``model.clock`` name: one builder per runner kind,
registered in ``RUNNERS``. Nothing here profiles: a simulated runner gets its cost model resolved before
the engine is built (engine/fitting/profile.py:resolve_cost_model)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from stallfree.engine.attention import make_attention_backend
from stallfree.engine.config import EngineConfig
from stallfree.engine.config_checks import require
from stallfree.engine.device import choose_dtype
from stallfree.engine.fitting.cost_model import CostModel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model
from stallfree.engine.model.stages import PipelineStage
from stallfree.engine.model.tensor_parallel import TensorParallel
from stallfree.engine.registry import Registry
from stallfree.engine.runner.base import Runner
from stallfree.engine.runner.clock import CLOCKS, Clock, VirtualClock, WallClock
from stallfree.engine.runner.cpu_threads import CpuThreads
from stallfree.engine.runner.kv_sizing import Baseline, CudaMemoryProbe
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.runner.simulated import SimulatedRunner
from stallfree.engine.scheduler import SCHEDULERS


@dataclass(frozen=True)
class RunnerSetup:
    """What a runner builder gets from the engine."""

    config: EngineConfig
    path: Path
    arch: ArchConfig
    max_model_len: int
    num_blocks: int | None  # None (model runner on CUDA): the runner sizes the KV cache from measured memory
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: set[int]
    cost_model: CostModel | None  # the simulated runner's, resolved before the engine is built
    tensor_parallel: TensorParallel | None = None  # this rank's shard (engine/distributed/); None: the whole model
    pipeline_stage: PipelineStage | None = None  # this rank's layers (engine/distributed/); None: all of them


RUNNERS: Registry[Callable[[RunnerSetup], tuple[Runner, Clock]]] = Registry("model.runner")


def max_tokens_per_iteration(config: EngineConfig) -> int:
    """The most tokens one iteration of the policy holds (``orca`` and ``faster_transformer`` admit whole
    prompts with no token budget: for them, as for ``vllm``, ``max_num_batched_tokens``)."""
    sc = config.scheduler
    return sc.chunk_size if SCHEDULERS[sc.policy].chunked else sc.max_num_batched_tokens


def make_runner(config: EngineConfig, path: Path, arch: ArchConfig, *, max_model_len: int, num_blocks: int | None,
                dtype: torch.dtype, device: torch.device, eos_token_ids: set[int],
                cost_model: CostModel | None = None) -> tuple[Runner, Clock]:
    setup = RunnerSetup(config, path, arch, max_model_len, num_blocks, dtype, device, eos_token_ids, cost_model)
    return RUNNERS[config.model.runner](setup)


@RUNNERS.register("model")
def model_runner(s: RunnerSetup) -> tuple[Runner, Clock]:
    mc, arch = s.config.model, s.arch
    memory = None
    if s.num_blocks is None:
        probe = CudaMemoryProbe(s.device)
        memory = probe, Baseline.take(probe)  # before the weights load
    tp = s.tensor_parallel
    weight_dtype = choose_dtype(mc.dtype, s.device).weight_dtype
    model = load_model(s.path, arch, s.max_model_len, s.dtype, s.device, tp, s.pipeline_stage, weight_dtype)
    heads = model.cfg  # the shard's heads under tensor parallelism
    attn = make_attention_backend(mc.attention_backend, s.device, s.dtype, num_heads=heads.num_heads,
                                  num_kv_heads=heads.num_kv_heads, head_dim=arch.head_dim, scale=arch.head_dim ** -0.5)
    # Sharded or staged: no CUDA graphs (NCCL all-reduces in a graph, or a graph fed a previous stage's hidden
    # states, have not been tried here), and each rank keeps the threads it was given (adaptive threads would
    # count the other ranks as load).
    whole = tp is None and s.pipeline_stage is None
    runner = ModelRunner(model, attn, s.num_blocks, s.config.cache.block_size, s.dtype, s.device, mc.seed,
                         cuda_graphs=mc.cuda_graphs and whole, max_num_seqs=s.config.scheduler.max_num_seqs,
                         max_model_len=s.max_model_len, max_num_batched_tokens=max_tokens_per_iteration(s.config),
                         gpu_memory_utilization=s.config.cache.gpu_memory_utilization, memory=memory,
                         op_split_every=mc.op_split_every,
                         cpu_threads=CpuThreads() if s.device.type == "cpu" and mc.adaptive_cpu_threads and whole
                         else None)
    return runner, WallClock()


@RUNNERS.register("simulated")
def simulated_runner(s: RunnerSetup) -> tuple[Runner, Clock]:
    mc = s.config.model
    clock = CLOCKS[mc.clock]()
    require(s.cost_model is not None, "model.cost_model",
            "set for runner=simulated, or the engine built with LLMEngine.from_config (which profiles one)", None)
    virtual = clock if isinstance(clock, VirtualClock) else None  # without one the runner sleeps
    return SimulatedRunner(s.cost_model, s.arch.vocab_size, s.eos_token_ids, virtual, mc.seed), clock
