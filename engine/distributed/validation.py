"""Parallel sizes checked against the model and the machine before any process starts: one-line errors
that name the option and the counts it must divide."""
from __future__ import annotations

import os

import torch

from stallfree.engine.config import ParallelConfig
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.model.arch import ArchConfig


def check_parallel(parallel: ParallelConfig, arch: ArchConfig, device: torch.device, ranks_here: int,
                   runner: str) -> None:
    """Raise ConfigError unless ``parallel`` splits ``arch`` evenly and the ``ranks_here`` ranks of this node
    each get a GPU (CUDA) or a core (CPU)."""
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if runner != "model":
        raise ConfigError(f"tensor_parallel_size={tp} and pipeline_parallel_size={pp} need runner=model, "
                          f"got runner={runner!r}")
    counts = {"attention heads": arch.num_heads, "KV heads": arch.num_kv_heads,
              "MLP intermediate size": arch.intermediate_size, "vocabulary size": arch.vocab_size}
    for what, count in counts.items():
        if count % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {count} {what} "
                              f"({arch.num_heads} attention heads, {arch.num_kv_heads} KV heads)")
    if pp > arch.num_layers:
        raise ConfigError(f"pipeline_parallel_size={pp} is more than the model's {arch.num_layers} layers")
    if device.type == "cuda":
        available, what = torch.cuda.device_count(), "GPUs"
    else:
        available, what = len(os.sched_getaffinity(0)), "CPU cores"
    if ranks_here > available:
        raise ConfigError(f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs {ranks_here} ranks on "
                          f"this node, one per device, but it has {available} {what}")
