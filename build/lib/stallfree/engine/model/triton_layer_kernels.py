"""Triton kernels for the decoder layer's element-wise ops on CUDA (imported only there: needs triton).

Each kernel rounds to the model dtype where the PyTorch ops it replaces round (``engine/model/llama.py``),
so bf16/fp16 outputs match the eager model's, not only fp32 ones.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_rms_norm_kernel(x, residual, out, weight, x_stride, residual_stride, out_stride, dim, eps,
                        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One row: with ``HAS_RESIDUAL``, residual += x (in place) and normalise the sum; else normalise x."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < dim
    dtype = out.dtype.element_ty
    h = tl.load(x + row * x_stride + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        h = (h.to(tl.float32) + tl.load(residual + row * residual_stride + cols, mask=ok, other=0.0)).to(dtype)
        tl.store(residual + row * residual_stride + cols, h, mask=ok)
    h32 = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h32 * h32, axis=0) / dim + eps)
    normed = (h32 * inv_rms).to(dtype)  # normalised in fp32, rounded, then scaled in the model dtype
    scaled = normed.to(tl.float32) * tl.load(weight + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * out_stride + cols, scaled.to(dtype), mask=ok)


@triton.jit
def rotary_kernel(q, k, cos, sin, q_stride_t, k_stride_t, cos_stride_t, num_heads, head_dim,
                  HALF_PADDED: tl.constexpr):
    """Rotate one head of one token in place (rotate-half form): program (token, head), heads of q then k."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    half = head_dim // 2
    cols = tl.arange(0, HALF_PADDED)
    ok = cols < half
    if head < num_heads:
        base = q + token * q_stride_t + head * head_dim
    else:
        base = k + token * k_stride_t + (head - num_heads) * head_dim
    dtype = base.dtype.element_ty
    x1 = tl.load(base + cols, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(base + half + cols, mask=ok, other=0.0).to(tl.float32)
    c1 = tl.load(cos + token * cos_stride_t + cols, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos + token * cos_stride_t + half + cols, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin + token * cos_stride_t + cols, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin + token * cos_stride_t + half + cols, mask=ok, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin, each product rounded as the eager ops round it
    out1 = (x1 * c1).to(dtype).to(tl.float32) - (x2 * s1).to(dtype).to(tl.float32)
    out2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    tl.store(base + cols, out1.to(dtype), mask=ok)
    tl.store(base + half + cols, out2.to(dtype), mask=ok)


@triton.jit
def silu_and_mul_kernel(gate_up, out, gate_up_stride, out_stride, dim, BLOCK: tl.constexpr):
    """silu(gate) * up for one block of one row of ``[gate | up]``."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < dim
    dtype = out.dtype.element_ty
    gate = tl.load(gate_up + row * gate_up_stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up + row * gate_up_stride + dim + cols, mask=ok, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out + row * out_stride + cols, (silu * up).to(dtype), mask=ok)
