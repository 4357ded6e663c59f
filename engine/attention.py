"""Paged attention backends: write new K/V by ``slot_mapping``, then attend over each sequence's blocks."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    start: int  # offset of its tokens in the flat batch
    num_tokens: int
    context_len: int  # tokens already in the cache before this chunk
    block_table: torch.Tensor  # [num_blocks] int64


@dataclass
class AttentionMetadata:
    """Flat batch layout: decode tokens first (one per sequence), then prefill chunks."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size] bool, True = attend
    prefills: list[PrefillSeq]


def bottom_right_causal_mask(num_queries: int, num_keys: int, device) -> torch.Tensor:
    """Query i (the last ``num_queries`` positions) sees key j iff j <= (num_keys - num_queries) + i."""
    q_pos = torch.arange(num_keys - num_queries, num_keys, device=device).unsqueeze(1)
    return torch.arange(num_keys, device=device).unsqueeze(0) <= q_pos


class SDPAAttention:
    """Portable backend on ``F.scaled_dot_product_attention`` (CPU and CUDA)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.gqa = num_heads != num_kv_heads

    def __call__(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]
        block_size = k_cache.shape[1]
        k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            keys = self._gather(k_cache, meta.decode_block_tables)  # [nd, Hkv, L, D]
            values = self._gather(v_cache, meta.decode_block_tables)
            out[:nd] = self._decode(q[:nd], keys, values, meta.decode_mask)
        for p in meta.prefills:
            qs = q[p.start:p.start + p.num_tokens].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            if p.context_len == 0:
                ks = k[p.start:p.start + p.num_tokens].transpose(0, 1).unsqueeze(0)
                vs = v[p.start:p.start + p.num_tokens].transpose(0, 1).unsqueeze(0)
                o = self._sdpa(qs, ks, vs, None, causal=True)
            else:
                total = p.context_len + p.num_tokens
                nblocks = -(-total // block_size)
                ks = self._gather(k_cache, p.block_table[:nblocks].unsqueeze(0))[:, :, :total]
                vs = self._gather(v_cache, p.block_table[:nblocks].unsqueeze(0))[:, :, :total]
                mask = bottom_right_causal_mask(p.num_tokens, total, q.device)
                o = self._sdpa(qs, ks, vs, mask)
            out[p.start:p.start + p.num_tokens] = o.squeeze(0).transpose(0, 1)
        return out.view(q.shape[0], -1)

    @staticmethod
    def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        b, nb = block_tables.shape
        _, bs, hkv, d = cache.shape
        return cache[block_tables].view(b, nb * bs, hkv, d).transpose(1, 2)

    def _decode(self, q, keys, values, mask) -> torch.Tensor:
        # One query per sequence: two batched matmuls beat the CPU SDPA kernel ~8x at this shape.
        nd, hkv, length, d = keys.shape
        qg = q.view(nd, hkv, self.num_heads // hkv, d)  # query heads grouped by their KV head
        scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * self.scale
        scores = scores.masked_fill(~mask.view(nd, 1, 1, length), float("-inf"))
        return torch.matmul(scores.softmax(-1).to(values.dtype), values).view(nd, self.num_heads, d)

    def _sdpa(self, q, k, v, mask, causal: bool = False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale,
                                              enable_gqa=self.gqa)


def make_attention_backend(name: str, device: torch.device, **kwargs) -> SDPAAttention:
    if name in ("auto", "sdpa"):
        return SDPAAttention(**kwargs)
    raise ValueError(f"unknown attention backend {name!r}; available: 'sdpa'")
