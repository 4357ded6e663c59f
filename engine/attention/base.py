"""The attention backend interface and the registry ``model.attention_backend`` names.

A backend owns its cache layout (``kv_cache_shape``), writes the new K/V by ``slot_mapping`` and
attends over each sequence's blocks: ``backend(q, k, v, k_cache, v_cache, meta) -> [T, H * D]``.
"""
from __future__ import annotations

from typing import Protocol

import torch

from stallfree.engine.attention.metadata import AttentionMetadata
from stallfree.engine.registry import Registry


class AttentionBackend(Protocol):
    """One instance serves every layer of a model."""

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """The shape of one layer's K cache (and of its V cache)."""
        ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q ``[T, H, D]``, k and v ``[T, Hkv, D]`` -> ``[T, H * D]``, after writing k and v to the caches."""
        ...


class AttentionBackendClass(Protocol):
    """A registered backend class: whether ``auto`` may take it here, and a constructor that checks."""

    auto_rank: int  # ``auto`` takes the available backend of lowest rank

    def available(self, device: torch.device, dtype: torch.dtype, head_dim: int) -> bool: ...

    def create(self, device: torch.device, dtype: torch.dtype, *, num_heads: int, num_kv_heads: int,
               head_dim: int, scale: float) -> AttentionBackend:
        """The backend, or a ValueError naming ``model.attention_backend`` when it cannot run here."""
        ...


ATTENTION_BACKENDS: Registry[AttentionBackendClass] = Registry("model.attention_backend",
                                                              resolved_by_caller=("auto",))
