"""CPU backend: one native kernel call per layer attends the whole batch (decodes and prefill chunks),
reading K/V in place from the paged cache.

The portable path gathers each sequence's blocks into a contiguous copy (~60% of decode attention at
batch 32 and 600-token contexts) and, for a chunk with cached context, runs SDPA with an explicit
mask, which CPU builds of torch compute without their flash kernel (~90 GFLOP/s on a bf16 machine at
128 queries x 1500 keys). The kernel reads each block where it lies and masks causally by position.
"""
from __future__ import annotations

import torch

from stallfree.engine.attention.base import ATTENTION_BACKENDS
from stallfree.engine.attention.metadata import AttentionMetadata
from stallfree.engine.native.cpu_kernels import HEAD_DIM_MULTIPLE, KERNEL_SUFFIXES, load_cpu_kernels


@ATTENTION_BACKENDS.register("cpu_paged")
class CPUPagedAttention:
    """Cache layout per layer: ``[num_kv_heads, num_blocks, block_size, head_dim]`` for V; K has the same
    shape but each block holds its keys transposed (``k_cache.view(Hkv, num_blocks, head_dim, block_size)``),
    so the kernel's Q.K^T loads run along the keys. In bf16 on a CPU with AVX512-BF16 (block sizes that are
    multiples of 16) the blocks hold pairs along each product's reduction instead, for the bf16 dot-product
    instruction: K as ``[head_dim / 2, block_size, 2]``, V as ``[block_size / 2, head_dim, 2]``. Only the
    kernel reads and writes the cache. Reads ``meta.query_start_loc``, ``meta.seq_lens`` and
    ``meta.block_tables``."""

    auto_rank = 2

    @staticmethod
    def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        return (device.type == "cpu" and dtype in KERNEL_SUFFIXES and head_dim % HEAD_DIM_MULTIPLE == 0
                and load_cpu_kernels() is not None)

    @classmethod
    def create(cls, device: torch.device, dtype: torch.dtype, **dims) -> CPUPagedAttention:
        if device.type != "cpu":
            raise ValueError(f"model.attention_backend='cpu_paged' runs on CPU, not {device.type}; use 'sdpa'")
        return cls(**dims, dtype=dtype)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype):
        if dtype not in KERNEL_SUFFIXES or head_dim % HEAD_DIM_MULTIPLE:
            raise ValueError(f"model.attention_backend='cpu_paged' supports dtypes {sorted(map(str, KERNEL_SUFFIXES))} "
                             f"and head dims that are multiples of {HEAD_DIM_MULTIPLE}, not {dtype} with head_dim "
                             f"{head_dim}; use 'sdpa'")
        lib = load_cpu_kernels()
        if lib is None:
            raise ValueError("model.attention_backend='cpu_paged' needs a C++ compiler to build its kernel "
                             "(see the log); use 'sdpa'")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.attention = getattr(lib, f"paged_attention_{KERNEL_SUFFIXES[dtype]}")
        self.write_cache = getattr(lib, f"write_cache_{KERNEL_SUFFIXES[dtype]}")

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (self.num_kv_heads, num_blocks, block_size, self.head_dim)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D], each head's D contiguous (token strides may differ)
        assert q.stride(2) == k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == self.head_dim
        _, num_blocks, block_size, _ = k_cache.shape
        threads = torch.get_num_threads()
        num_tokens = q.shape[0]
        self.write_cache(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                         meta.slot_mapping.data_ptr(), num_tokens, self.num_kv_heads, self.head_dim, num_blocks,
                         block_size, threads)
        out = torch.empty(num_tokens, self.num_heads, self.head_dim, dtype=q.dtype)
        tables = meta.block_tables
        self.attention(q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(),
                       tables.data_ptr(), tables.stride(0), meta.query_start_loc.data_ptr(), meta.seq_lens.data_ptr(),
                       meta.seq_lens.shape[0], out.data_ptr(), self.num_heads, self.num_kv_heads, self.head_dim,
                       num_blocks, block_size, self.scale, threads)
        return out.view(num_tokens, -1)
