"""The CUDA backend on flash-attn 2.x: one ``flash_attn_varlen_func`` call over the whole flat batch."""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from stallfree.engine.attention.base import ATTENTION_BACKENDS
from stallfree.engine.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)


def flash_attn_import_error() -> str | None:
    """Why ``flash_attn`` cannot be imported here (not installed, or built against another torch: an
    undefined symbol), or None when it imports. A real import, not a package lookup: a flash-attn that
    is present but broken must make ``auto`` fall back, not fail at startup."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as e:  # ImportError, OSError from a mismatched build, ...
        return f"{type(e).__name__}: {e}"
    return None


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this backend can run here: a CUDA device, fp16/bf16, and a flash-attn that imports."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if (error := flash_attn_import_error()) is not None:
        if importlib.util.find_spec("flash_attn") is not None:
            log.warning("flash-attn is installed but does not import (%s); not using it", error)
        return False
    return True


@ATTENTION_BACKENDS.register("flash_attn")
class FlashAttention:
    """Paged attention on ``flash_attn_varlen_func`` (CUDA, fp16/bf16).

    Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``, flash-attn's paged
    layout. Each step gathers every sequence's keys/values from the cache into one packed
    ``[total_k, Hkv, D]`` tensor (a single ``index_select``) and runs ONE varlen call for decodes and
    prefill chunks together. Why gather instead of passing ``block_table``: the gather works for any
    ``block_size``, whereas flash-attn's own paged path needs the page size to be a multiple of 256.
    The gather costs a copy of every sequence's K/V per layer; the slots are computed once per batch
    from host-known sizes, without a host sync. With ``causal=True`` flash-attn (>= 2.1) aligns the mask
    bottom-right, so a chunk sees its whole context plus the causal part of itself, and a decode (1 query)
    sees all its keys. GQA is native. Not graph-safe (the packed sizes change every step): ``auto``
    prefers ``triton`` on CUDA, and the runner logs that graphs are off when this backend is chosen.

    ``varlen_func`` replaces ``flash_attn.flash_attn_varlen_func`` (tests pass a torch reference).
    """

    auto_rank = 1  # after ``triton``

    @staticmethod
    def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return flash_attn_available(device, dtype)

    @classmethod
    def create(cls, device: torch.device, dtype: torch.dtype, **dims) -> FlashAttention:
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"model.attention_backend='flash_attn' runs on CUDA in fp16/bf16, not {device.type} "
                             f"{dtype}; use 'sdpa'")
        return cls(**dims)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 varlen_func: Callable[..., torch.Tensor] | None = None):
        if varlen_func is None:
            if (error := flash_attn_import_error()) is not None:
                raise ValueError(f"model.attention_backend='flash_attn' needs the flash-attn package built for this "
                                 f"torch (pip install flash-attn) and a CUDA device ({error}); use 'triton' or "
                                 "'sdpa' otherwise")
            from flash_attn import flash_attn_varlen_func
            varlen_func = flash_attn_varlen_func
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.varlen_func = varlen_func

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D]. The batch is packed already: decodes first, then the
        # prefill chunks back to back in ``meta.prefills`` order.
        block_size = k_cache.shape[1]
        k_flat = k_cache.view(-1, self.num_kv_heads, self.head_dim)  # [num_blocks * block_size, Hkv, D]
        v_flat = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)

        if "flash_attn" not in meta.per_batch:
            meta.per_batch["flash_attn"] = self._varlen_layout(meta, block_size, q.device)
        slots, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = meta.per_batch["flash_attn"]
        out = self.varlen_func(q, k_flat.index_select(0, slots), v_flat.index_select(0, slots),
                               cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=self.scale, causal=True)
        return out.reshape(q.shape[0], -1)

    def _varlen_layout(self, meta: AttentionMetadata, block_size: int, device: torch.device) -> tuple:
        """Packed key slots, cu_seqlens and max lengths, computed once per batch (not per layer) from the
        unified batch fields; every size comes from the host (no ``.item()``, no boolean-mask index), so
        building them never waits for the device."""
        seq_lens = meta.seq_lens
        cu_seqlens_k = F.pad(seq_lens.cumsum(0), (1, 0))
        seq_of_key = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=device), seq_lens,
                                             output_size=meta.num_kv_tokens)
        position = torch.arange(meta.num_kv_tokens, device=device) - cu_seqlens_k[seq_of_key]
        slots = meta.block_tables[seq_of_key, position // block_size] * block_size + position % block_size
        return (slots, meta.query_start_loc.to(torch.int32), cu_seqlens_k.to(torch.int32), meta.max_query_len,
                meta.max_seq_len)
