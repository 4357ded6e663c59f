"""Paged attention backends behind one call: ``backend(q, k, v, k_cache, v_cache, meta) -> [T, H * D]``
(the ``AttentionBackend`` protocol, engine/attention/base.py), registered by name in ``ATTENTION_BACKENDS``.
"""
from __future__ import annotations

import logging

import torch

from stallfree.engine.attention.base import ATTENTION_BACKENDS, AttentionBackend, AttentionBackendClass
from stallfree.engine.attention.cpu_paged import CPUPagedAttention
from stallfree.engine.attention.flash_attn import FlashAttention
from stallfree.engine.attention.metadata import AttentionMetadata, PrefillSeq, bottom_right_causal_mask
from stallfree.engine.attention.sdpa import SDPAAttention
from stallfree.engine.attention.triton_unified import TritonAttention

__all__ = ["ATTENTION_BACKENDS", "AttentionBackend", "AttentionBackendClass", "AttentionMetadata",
           "CPUPagedAttention", "FlashAttention", "PrefillSeq", "SDPAAttention", "TritonAttention", "auto_backend",
           "bottom_right_causal_mask", "make_attention_backend"]

log = logging.getLogger(__name__)


def auto_backend(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The available backend of lowest ``auto_rank``: the fastest that runs here (``sdpa`` runs anywhere)."""
    ranked = sorted(ATTENTION_BACKENDS, key=lambda name: ATTENTION_BACKENDS[name].auto_rank)
    return next(name for name in ranked if ATTENTION_BACKENDS[name].available(device, dtype, head_dim))


def make_attention_backend(name: str, device: torch.device, dtype: torch.dtype, *, num_heads: int,
                           num_kv_heads: int, head_dim: int, scale: float) -> AttentionBackend:
    if name == "auto":
        name = auto_backend(device, dtype, head_dim)
        log.info("attention backend: %s (auto, on %s %s)", name, device.type, str(dtype).removeprefix("torch."))
    return ATTENTION_BACKENDS[name].create(device, dtype, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                           head_dim=head_dim, scale=scale)
