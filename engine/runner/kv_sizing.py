"""KV cache sizing on CUDA, as vLLM does it: the engine may use ``gpu_memory_utilization`` x the GPU's
TOTAL memory; the KV cache gets what is left of that after the weights, the peak activations of a
warm-up forward pass at the largest batch, memory outside torch's allocator (CUDA context, cuBLAS), and
the decode CUDA graphs' memory pool.

``kv_cache_bytes`` is the rule, a pure function of the measured figures (tested on CPU with made-up
ones); ``CudaMemoryProbe`` reads the figures from torch.cuda; ``measure`` runs the measurement around the
model runner's warm-up passes. The CPU path keeps ``cache.kv_memory_gib`` per rank (``blocks_for_budget``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from stallfree.engine.config import CacheConfig, ParallelConfig
from stallfree.engine.model.arch import ArchConfig

GIB = 2**30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes, measured on the device."""

    total: int  # the device's memory
    free_at_start: int  # free before this engine loaded anything
    weights_and_activations: int  # torch's peak allocation over the weights and a warm-up at the max batch
    non_torch: int  # what the device lost outside torch's allocator meanwhile (CUDA context, libraries)
    graphs: int  # the decode graphs' pool: the activations of a decode pass at the largest bucket; 0 without


def blocks_for_budget(arch: ArchConfig, cache: CacheConfig, parallel: ParallelConfig, dtype: torch.dtype) -> int:
    """The KV blocks ``cache.kv_memory_gib`` holds on one rank (CPU): a rank holds its pipeline stage's layers
    and its share of the KV heads."""
    num_layers = -(-arch.num_layers // parallel.pipeline_parallel_size)
    num_kv_heads = max(1, arch.num_kv_heads // parallel.tensor_parallel_size)
    bytes_per_block = (2 * num_layers * cache.block_size * num_kv_heads * arch.head_dim
                       * torch.empty((), dtype=dtype).element_size())
    return max(1, int(cache.kv_memory_gib * GIB // bytes_per_block))


def kv_cache_bytes(profile: MemoryProfile, utilization: float) -> int:
    """The KV cache's share of ``utilization`` x total memory; a ValueError naming the setting when the
    GPU has less free than that or nothing is left for the cache."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    requested = profile.total * utilization
    if profile.free_at_start < requested:
        raise ValueError(f"gpu_memory_utilization={utilization} asks for {requested / GIB:.1f} GiB of the "
                         f"GPU's {profile.total / GIB:.1f} GiB, but only {profile.free_at_start / GIB:.1f} GiB was "
                         "free at startup (other processes use the rest): lower it or free the GPU")
    taken = profile.weights_and_activations + profile.non_torch + profile.graphs
    if taken >= requested:
        raise ValueError(f"gpu_memory_utilization={utilization} ({requested / GIB:.1f} GiB) leaves nothing for "
                         f"the KV cache: weights, activations and CUDA graphs take {taken / GIB:.1f} GiB; raise it "
                         "or lower scheduler.max_num_batched_tokens / max_num_seqs")
    return int(requested - taken)


class MemoryProbe(Protocol):
    """The device memory counters the measurement reads."""

    def free_and_total(self) -> tuple[int, int]: ...

    def allocated(self) -> int: ...

    def reserved(self) -> int: ...

    def peak_allocated(self) -> int: ...

    def reset_peak(self) -> None: ...


class CudaMemoryProbe:
    def __init__(self, device: torch.device):
        self.device = device

    def free_and_total(self) -> tuple[int, int]:
        torch.cuda.synchronize(self.device)
        return torch.cuda.mem_get_info(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def peak_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


@dataclass(frozen=True)
class Baseline:
    """The probe's figures before the engine loads its weights."""

    free: int
    total: int
    allocated: int
    reserved: int

    @classmethod
    def take(cls, probe: MemoryProbe) -> Baseline:
        probe.reset_peak()
        free, total = probe.free_and_total()
        return cls(free, total, probe.allocated(), probe.reserved())


def measure(probe: MemoryProbe, baseline: Baseline, warm_up_max_batch: Callable[[], None],
            warm_up_decode: Callable[[], None] | None) -> MemoryProfile:
    """Run the warm-ups (weights are loaded already) and return the figures ``kv_cache_bytes`` needs.
    ``warm_up_decode``: a decode pass at the largest graph bucket (None without graphs)."""
    warm_up_max_batch()
    weights_and_activations = probe.peak_allocated() - baseline.allocated
    graphs = 0
    if warm_up_decode is not None:
        before = probe.allocated()
        probe.reset_peak()
        warm_up_decode()
        graphs = probe.peak_allocated() - before
    free, _ = probe.free_and_total()
    non_torch = (baseline.free - free) - (probe.reserved() - baseline.reserved)
    return MemoryProfile(total=baseline.total, free_at_start=baseline.free,
                         weights_and_activations=weights_and_activations, non_torch=max(0, non_torch),
                         graphs=graphs)
