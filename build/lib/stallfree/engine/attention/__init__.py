"""Paged attention backends behind one call: ``backend(q, k, v, k_cache, v_cache, meta) -> [T, H * D]``.

Each backend owns its cache layout (``kv_cache_shape``), writes the new K/V by ``slot_mapping`` and
attends over each sequence's blocks.
"""
from __future__ import annotations

import logging

import torch

from stallfree.engine.attention.cpu_paged import CPUPagedAttention, cpu_paged_available
from stallfree.engine.attention.flash_attn import FlashAttention, flash_attn_available
from stallfree.engine.attention.metadata import AttentionMetadata, PrefillSeq, bottom_right_causal_mask
from stallfree.engine.attention.sdpa import SDPAAttention
from stallfree.engine.attention.triton_unified import TritonAttention, triton_available

__all__ = ["AttentionMetadata", "CPUPagedAttention", "FlashAttention", "PrefillSeq", "SDPAAttention",
           "TritonAttention", "auto_backend", "bottom_right_causal_mask", "make_attention_backend"]

ATTENTION_BACKENDS = ("auto", "sdpa", "cpu_paged", "flash_attn", "triton")
log = logging.getLogger(__name__)


def auto_backend(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The fastest backend that runs here. On CUDA ``triton`` comes first although flash-attn's kernel is
    faster per call: only ``triton`` can be captured in the decode CUDA graphs, and without graphs every
    decode step pays its launches and host syncs."""
    if device.type == "cuda" and triton_available(device):
        return "triton"
    if flash_attn_available(device, dtype):
        return "flash_attn"
    if cpu_paged_available(device, dtype, head_dim):
        return "cpu_paged"
    return "sdpa"


def make_attention_backend(name: str, device: torch.device, dtype: torch.dtype, *, num_heads: int,
                           num_kv_heads: int, head_dim: int, scale: float):
    dims = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale)
    if name == "auto":
        name = auto_backend(device, dtype, head_dim)
        log.info("attention backend: %s (auto, on %s %s)", name, device.type, str(dtype).removeprefix("torch."))
    if name == "sdpa":
        return SDPAAttention(**dims)
    if name == "cpu_paged":
        if device.type != "cpu":
            raise ValueError(f"model.attention_backend='cpu_paged' runs on CPU, not {device.type}; use 'sdpa'")
        return CPUPagedAttention(**dims, dtype=dtype)
    if name == "flash_attn":
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"model.attention_backend='flash_attn' runs on CUDA in fp16/bf16, not {device.type} "
                             f"{dtype}; use 'sdpa'")
        return FlashAttention(**dims)
    if name == "triton":
        if not triton_available(device):
            raise ValueError(f"model.attention_backend='triton' needs the triton package and a CUDA device (on CPU "
                             f"only under TRITON_INTERPRET=1, for tests), not {device.type}; use 'sdpa'")
        return TritonAttention(**dims, dtype=dtype)
    raise ValueError(f"unknown model.attention_backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}")
