"""The CUDA backend on flash-attn 2.x: one ``flash_attn_varlen_func`` call over the whole flat batch."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from itertools import accumulate

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this backend can run here: a CUDA device, fp16/bf16, and the flash-attn package installed."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and importlib.util.find_spec("flash_attn") is not None)


class FlashAttention:
    """Paged attention on ``flash_attn_varlen_func`` (CUDA, fp16/bf16).

    Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``, flash-attn's paged
    layout. Each step gathers every sequence's keys/values from the cache into one packed
    ``[total_k, Hkv, D]`` tensor (a single ``index_select``) and runs ONE varlen call for decodes and
    prefill chunks together. Why gather instead of passing ``block_table``: the gather works for any
    ``block_size``, whereas flash-attn's own paged path needs the page size to be a multiple of 256.
    With ``causal=True`` flash-attn (>= 2.1) aligns the mask bottom-right, so a chunk sees its whole
    context plus the causal part of itself, and a decode (1 query) sees all its keys. GQA is native.

    ``varlen_func`` replaces ``flash_attn.flash_attn_varlen_func`` (tests pass a torch reference).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 varlen_func: Callable[..., torch.Tensor] | None = None):
        if varlen_func is None:
            try:
                from flash_attn import flash_attn_varlen_func
            except ImportError as e:
                raise ValueError("model.attention_backend='flash_attn' needs the flash-attn package "
                                 "(pip install flash-attn) and a CUDA device; use 'sdpa' otherwise") from e
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
        """Packed key slots, cu_seqlens and max lengths; computed once per batch (one host sync), not per layer."""
        slots, seqlens_k = self._packed_slots(meta, block_size, device)
        seqlens_q = [1] * meta.num_decodes + [p.num_tokens for p in meta.prefills]
        cu_seqlens_q = torch.tensor([0, *accumulate(seqlens_q)], dtype=torch.int32, device=device)
        cu_seqlens_k = F.pad(seqlens_k.cumsum(0), (1, 0)).to(torch.int32)
        return slots, cu_seqlens_q, cu_seqlens_k, max(seqlens_q), int(seqlens_k.max())

    @staticmethod
    def _packed_slots(meta: AttentionMetadata, block_size: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache slots of every sequence's keys, concatenated in batch order, and each sequence's key count."""
        offsets = torch.arange(block_size, device=device)
        parts: list[torch.Tensor] = []
        lens: list[torch.Tensor] = []
        if meta.num_decodes:
            tables, seq_lens = meta.decode_block_tables, meta.decode_seq_lens
            grid = (tables.unsqueeze(-1) * block_size + offsets).flatten(1)  # [nd, max_blocks * block_size]
            parts.append(grid[torch.arange(grid.shape[1], device=device) < seq_lens.unsqueeze(1)])
            lens.append(seq_lens)
        for p in meta.prefills:
            total = p.context_len + p.num_tokens
            table = p.block_table[:-(-total // block_size)]
            parts.append((table.unsqueeze(-1) * block_size + offsets).flatten()[:total])
        if meta.prefills:
            lens.append(torch.tensor([p.context_len + p.num_tokens for p in meta.prefills], device=device))
        return torch.cat(parts), torch.cat(lens)
