"""Paged attention backends behind one call: ``backend(q, k, v, k_cache, v_cache, meta) -> [T, H * D]``.

Each backend owns its cache layout (``kv_cache_shape``), writes the new K/V by ``slot_mapping`` and
attends over each sequence's blocks.
"""
from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata, PrefillSeq, bottom_right_causal_mask
from engine.attention.sdpa import SDPAAttention

__all__ = ["AttentionMetadata", "PrefillSeq", "SDPAAttention", "bottom_right_causal_mask", "make_attention_backend"]

ATTENTION_BACKENDS = ("auto", "sdpa")


def make_attention_backend(name: str, device: torch.device, dtype: torch.dtype, *, num_heads: int,
                           num_kv_heads: int, head_dim: int, scale: float):
    dims = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale)
    if name in ("auto", "sdpa"):
        return SDPAAttention(**dims)
    raise ValueError(f"unknown model.attention_backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
