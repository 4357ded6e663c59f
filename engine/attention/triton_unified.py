"""The Triton backend: one kernel launch per layer for decodes and prefill chunks together, reading the
paged KV cache in place (after vLLM's ``triton_unified_attention`` design).

Each program takes ``BLOCK_Q`` query tokens of one sequence and all the query heads of one KV head
(GQA: the group shares every K/V tile it loads), walks the sequence's keys tile by tile through its
block table and keeps an online softmax. The causal mask is aligned bottom-right: query i of a chunk
with ``context`` cached tokens sees keys ``0 .. context + i``.

Triton runs on CUDA. With ``TRITON_INTERPRET=1`` set before triton is imported, its interpreter runs
the same kernel on CPU tensors: that is for testing only (slow), and the registry accepts ``triton`` on
CPU only then.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from engine.attention.metadata import AttentionMetadata


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_available(device: torch.device) -> bool:
    """Whether this backend can run here: triton installed, on CUDA (or on CPU under the interpreter)."""
    runs_here = device.type == "cuda" or (device.type == "cpu" and triton_interpreted())
    return runs_here and importlib.util.find_spec("triton") is not None


class TritonAttention:
    """Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    Reads ``meta.query_start_loc``, ``meta.seq_lens`` and ``meta.block_tables``. The launch grid depends
    only on the batch's token and sequence counts, and nothing syncs with the host, so a decode-only
    step can be captured in a CUDA graph (``cuda_graph_safe``).
    """

    cuda_graph_safe = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype):
        from engine.attention.triton_kernel import unified_attention_kernel  # imports triton

        self.kernel = unified_attention_kernel
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.group = num_heads // num_kv_heads
        # At least 16 rows for tl.dot: BLOCK_Q query tokens x the group's heads.
        self.block_m = max(16, 1 << (self.group - 1).bit_length())
        self.block_q = self.block_m // self.group
        # fp32 models must not fall to TF32 in tl.dot on CUDA.
        self.dot_precision = "ieee" if dtype == torch.float32 else "tf32"

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D]
        num_blocks, block_size = k_cache.shape[:2]
        k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        num_tokens, num_seqs = q.shape[0], meta.seq_lens.shape[0]
        # An upper bound on the query blocks (a sequence of n tokens has <= n // BLOCK_Q + 1 of them);
        # programs past a sequence's last block return at once.
        grid = (num_tokens // self.block_q + num_seqs, self.num_kv_heads)
        self.kernel[grid](
            out, q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, self.scale,
            num_seqs, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
            GROUP=self.group, HEAD_DIM=self.head_dim, HEAD_DIM_PADDED=1 << (self.head_dim - 1).bit_length(),
            BLOCK_SIZE=block_size, BLOCK_Q=self.block_q, BLOCK_M=self.block_m,
            TILE_N=max(32, block_size) if q.is_cuda else 16, DOT_PRECISION=self.dot_precision,
        )
        return out.view(num_tokens, -1)
