"""The Triton backend: one kernel launch per layer for decodes and prefill chunks together, reading the
paged KV cache in place (after vLLM's ``triton_unified_attention`` design).

Each program takes ``BLOCK_Q`` query tokens of one sequence and all the query heads of one KV head
(GQA: the group shares every K/V tile it loads), walks the sequence's keys tile by tile through its
block table and keeps an online softmax. The causal mask is aligned bottom-right: query i of a chunk
with ``context`` cached tokens sees keys ``0 .. context + i``. A decode-only step whose (sequence,
KV head) pairs would leave SMs idle splits each sequence's keys into ``num_segments`` segments instead
(split-KV: more programs, then one small kernel merges their softmax states).

Triton runs on CUDA. With ``TRITON_INTERPRET=1`` set before the kernels are defined, its interpreter
runs them on CPU tensors: that is for testing only (slow), and the registry accepts ``triton`` on CPU
only then.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

from stallfree.engine.attention.base import ATTENTION_BACKENDS
from stallfree.engine.attention.metadata import AttentionMetadata


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_available(device: torch.device) -> bool:
    """Whether this backend can run here: triton installed, on CUDA (or on CPU under the interpreter)."""
    runs_here = device.type == "cuda" or (device.type == "cpu" and triton_interpreted())
    return runs_here and importlib.util.find_spec("triton") is not None


def default_tile_n(block_size: int, device: torch.device) -> int:
    """Keys per tile: at least 32 on CUDA (tensor-core friendly), 16 under the CPU interpreter (fast)."""
    return max(32, block_size) if device.type == "cuda" else 16


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 elsewhere (the interpreter never needs the split)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


@ATTENTION_BACKENDS.register("triton")
class TritonAttention:
    """Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    Reads ``meta.query_start_loc``, ``meta.seq_lens``, ``meta.block_tables`` and ``meta.max_query_len``
    (host int). The launch grids depend only on the batch's token and sequence counts, and nothing syncs
    with the host, so a decode-only step can be captured in a CUDA graph (``cuda_graph_safe``).

    ``tile_n`` (keys per tile) defaults to ``default_tile_n``; ``split_kv_below`` (split decode-only
    steps with fewer (sequence, KV head) pairs than this) defaults to the device's SM count. Tests set
    both to run the CUDA shapes and the split path under the interpreter.
    """

    cuda_graph_safe = True
    # First on CUDA although flash-attn's kernel is faster per call: only ``triton`` can be captured in
    # the decode CUDA graphs, and without graphs every decode step pays its launches and host syncs.
    auto_rank = 0

    @staticmethod
    def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return device.type == "cuda" and triton_available(device)  # never the CPU interpreter (tests only)

    @classmethod
    def create(cls, device: torch.device, dtype: torch.dtype, **dims) -> TritonAttention:
        if not triton_available(device):
            raise ValueError(f"model.attention_backend='triton' needs the triton package and a CUDA device (on CPU "
                             f"only under TRITON_INTERPRET=1, for tests), not {device.type}; use 'sdpa'")
        return cls(**dims, dtype=dtype)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype, *,
                 tile_n: int | None = None, split_kv_below: int | None = None, num_segments: int = 16):
        # Imports triton. Through sys.modules, not the package attribute: tests re-import it under the
        # CPU interpreter.
        self.kernels = importlib.import_module("stallfree.engine.attention.triton_kernel")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.group = num_heads // num_kv_heads
        self.head_dim_padded = 1 << (head_dim - 1).bit_length()
        # At least 16 rows for tl.dot: BLOCK_Q query tokens x the group's heads.
        self.block_m = max(16, 1 << (self.group - 1).bit_length())
        self.block_q = self.block_m // self.group
        # fp32 models must not fall to TF32 in tl.dot on CUDA.
        self.dot_precision = "ieee" if dtype == torch.float32 else "tf32"
        self.tile_n, self.split_kv_below, self.num_segments = tile_n, split_kv_below, num_segments

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def uses_split_kv(self, meta: AttentionMetadata, device: torch.device) -> bool:
        split_below = num_sms(device) if self.split_kv_below is None else self.split_kv_below
        return meta.max_query_len == 1 and meta.seq_lens.shape[0] * self.num_kv_heads < split_below

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D]
        block_size = k_cache.shape[1]
        k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        common = dict(GROUP=self.group, HEAD_DIM=self.head_dim, HEAD_DIM_PADDED=self.head_dim_padded,
                      BLOCK_SIZE=block_size, BLOCK_M=self.block_m,
                      TILE_N=self.tile_n or default_tile_n(block_size, q.device), DOT_PRECISION=self.dot_precision)
        cache_strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0))
        num_tokens, num_seqs = q.shape[0], meta.seq_lens.shape[0]
        if self.uses_split_kv(meta, q.device):
            self._split_kv_decode(out, q, k_cache, v_cache, meta, cache_strides, common)
            return out.view(num_tokens, -1)
        # An upper bound on the query blocks (a sequence of n tokens has <= n // BLOCK_Q + 1 of them);
        # programs past a sequence's last block return at once.
        grid = (num_tokens // self.block_q + num_seqs, self.num_kv_heads)
        self.kernels.unified_attention_kernel[grid](
            out, q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, self.scale,
            num_seqs, q.stride(0), q.stride(1), out.stride(0), out.stride(1), *cache_strides,
            BLOCK_Q=self.block_q, **common)
        return out.view(num_tokens, -1)

    def _split_kv_decode(self, out, q, k_cache, v_cache, meta: AttentionMetadata, cache_strides, common) -> None:
        num_seqs, segments = q.shape[0], self.num_segments
        partial_acc = torch.empty(num_seqs, self.num_heads, segments, self.head_dim_padded, dtype=torch.float32,
                                  device=q.device)
        partial_max = torch.empty(num_seqs, self.num_heads, segments, dtype=torch.float32, device=q.device)
        partial_sum = torch.empty_like(partial_max)
        self.kernels.split_kv_decode_kernel[(num_seqs, self.num_kv_heads, segments)](
            partial_acc, partial_max, partial_sum, q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
            self.scale, self.num_heads, q.stride(0), q.stride(1), *cache_strides, NUM_SEGMENTS=segments, **common)
        self.kernels.split_kv_reduce_kernel[(num_seqs, self.num_heads)](
            out, partial_acc, partial_max, partial_sum, self.num_heads, out.stride(0), out.stride(1),
            HEAD_DIM=self.head_dim, HEAD_DIM_PADDED=self.head_dim_padded, NUM_SEGMENTS=segments)
