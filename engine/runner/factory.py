"""Build the model runner (a real forward pass) of one process, or of one rank of a distributed engine, from
what the engine knows of it (``RunnerSetup``). Which runner an engine gets is chosen in engine/executor.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from stallfree.engine.attention import make_attention_backend
from stallfree.engine.config import EngineConfig
from stallfree.engine.device import choose_dtype
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model
from stallfree.engine.model.stages import PipelineStage
from stallfree.engine.model.tensor_parallel import TensorParallel
from stallfree.engine.runner.cpu_threads import CpuThreads
from stallfree.engine.runner.kv_sizing import Baseline, CudaMemoryProbe
from stallfree.engine.runner.model_runner import ModelRunner
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
    tensor_parallel: TensorParallel | None = None  # this rank's shard (engine/distributed/); None: the whole model
    pipeline_stage: PipelineStage | None = None  # this rank's layers (engine/distributed/); None: all of them


def max_tokens_per_iteration(config: EngineConfig) -> int:
    """The most tokens one iteration of the policy holds (``orca`` and ``faster_transformer`` admit whole
    prompts with no token budget: for them, as for ``vllm``, ``max_num_batched_tokens``)."""
    sc = config.scheduler
    return sc.chunk_size if SCHEDULERS[sc.policy].chunked else sc.max_num_batched_tokens


def build_model_runner(s: RunnerSetup) -> ModelRunner:
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
    return runner

