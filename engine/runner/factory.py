"""Build the runner and clock that ``model.runner`` / ``model.clock`` name."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from stallfree.engine.attention import make_attention_backend
from stallfree.engine.config import EngineConfig
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model
from stallfree.engine.runner.base import Runner
from stallfree.engine.runner.clock import Clock, VirtualClock, WallClock
from stallfree.engine.runner.cost_model import CostModel
from stallfree.engine.runner.cpu_threads import CpuThreads
from stallfree.engine.runner.kv_sizing import Baseline, CudaMemoryProbe
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.runner.profile import ProfiledEngine, profile_cost_model
from stallfree.engine.runner.simulated import SimulatedRunner

RUNNERS = ("model", "simulated")
CLOCKS = ("real", "virtual")


def max_tokens_per_iteration(config: EngineConfig) -> int:
    """The most tokens one iteration of the policy holds (``orca`` and ``faster_transformer`` admit whole
    prompts with no token budget: for them, as for ``vllm``, ``max_num_batched_tokens``)."""
    sc = config.scheduler
    return sc.chunk_size if sc.policy in ("sarathi", "chunked_prefill") else sc.max_num_batched_tokens


def make_runner(config: EngineConfig, path: Path, arch: ArchConfig, *, max_model_len: int, num_blocks: int | None,
                dtype: torch.dtype, device: torch.device, eos_token_ids: set[int],
                make_engine: Callable[[EngineConfig], ProfiledEngine]) -> tuple[Runner, Clock]:
    """``make_engine`` builds a real engine for profiling a cost model when ``model.cost_model`` is unset.
    ``num_blocks=None`` (model runner on CUDA): the runner sizes the KV cache from measured memory."""
    mc = config.model
    if mc.runner == "model":
        memory = None
        if num_blocks is None:
            probe = CudaMemoryProbe(device)
            memory = probe, Baseline.take(probe)  # before the weights load
        model = load_model(path, arch, max_model_len, dtype, device)
        attn = make_attention_backend(mc.attention_backend, device, dtype, num_heads=arch.num_heads,
                                      num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                                      scale=arch.head_dim ** -0.5)
        runner = ModelRunner(model, attn, num_blocks, config.cache.block_size, dtype, device, mc.seed,
                             cuda_graphs=mc.cuda_graphs, max_num_seqs=config.scheduler.max_num_seqs,
                             max_model_len=max_model_len, max_num_batched_tokens=max_tokens_per_iteration(config),
                             gpu_memory_utilization=config.cache.gpu_memory_utilization, memory=memory,
                             op_split_every=mc.op_split_every,
                             cpu_threads=CpuThreads() if device.type == "cpu" and mc.adaptive_cpu_threads else None)
        return runner, WallClock()
    if mc.runner == "simulated":
        if mc.clock not in CLOCKS:
            raise ValueError(f"unknown model.clock {mc.clock!r}; choose {' or '.join(CLOCKS)}")
        cost_model = CostModel.load(mc.cost_model) if mc.cost_model else profile_cost_model(config, make_engine)
        virtual = VirtualClock() if mc.clock == "virtual" else None
        runner = SimulatedRunner(cost_model, arch.vocab_size, eos_token_ids, virtual, mc.seed)
        return runner, virtual or WallClock()
    raise ValueError(f"unknown model.runner {mc.runner!r}; choose {' or '.join(RUNNERS)}")
