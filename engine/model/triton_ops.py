"""The decoder layer's element-wise ops on CUDA through Triton kernels (``triton_layer_kernels.py``).

Why: eager PyTorch runs RMSNorm (about 9 ops), the residual add, rotary (mul/neg/cat/add for Q and K)
and SiLU-and-mul as separate kernels: about 1,040 of the ~1,200 kernels of one decode step of a
32-layer model, each a launch (and a graph node) that moves the activations through memory again.
Each Triton module here replaces its PyTorch parent in place at load time, keeps its parameters,
and writes into tensors the layer no longer needs (as ``native_ops.py`` does on the CPU).
"""
from __future__ import annotations

import importlib
import importlib.util

import torch
from torch import nn

from stallfree.engine.model.llama import ApplyRotary, RMSNorm, SiluAndMul

SILU_BLOCK = 1024


def can_use_triton_ops(device: torch.device) -> bool:
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def _kernels():
    # Looked up at call time (not at import): tests re-import it under Triton's CPU interpreter.
    return importlib.import_module("stallfree.engine.model.triton_layer_kernels")


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class TritonRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        rows, dim = x.shape
        assert x.stride(1) == 1, "rows of contiguous features"
        out = torch.empty_like(x) if residual is None else x  # x: the sublayer's output, not needed after this
        res = x if residual is None else residual
        assert res.stride(1) == 1
        _kernels().add_rms_norm_kernel[(rows,)](
            x, res, out, self.weight, x.stride(0), res.stride(0), out.stride(0), dim, self.eps,
            HAS_RESIDUAL=residual is not None, BLOCK=_pow2(dim))
        return out if residual is None else (out, residual)


class TritonApplyRotary(ApplyRotary):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        # q: [T, H, D], k: [T, Hkv, D], views of the fresh qkv projection: rotated in place
        cos, sin = cos_sin  # [T, 1, D]
        tokens, num_heads, head_dim = q.shape
        assert q.stride(1) == k.stride(1) == head_dim and q.stride(2) == k.stride(2) == 1
        assert cos.stride() == sin.stride() and cos.stride(2) == 1
        if tokens:
            _kernels().rotary_kernel[(tokens, num_heads + k.shape[1])](
                q, k, cos, sin, q.stride(0), k.stride(0), cos.stride(0), num_heads, head_dim,
                HALF_PADDED=_pow2(head_dim // 2))
        return q, k


class TritonSiluAndMul(SiluAndMul):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
        assert gate_up.stride(1) == 1
        out = gate_up.new_empty(rows, dim)
        block = min(SILU_BLOCK, _pow2(dim))
        if rows:
            _kernels().silu_and_mul_kernel[(rows, -(-dim // block))](
                gate_up, out, gate_up.stride(0), out.stride(0), dim, BLOCK=block)
        return out


TRITON_MODULES: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: TritonRMSNorm, ApplyRotary: TritonApplyRotary, SiluAndMul: TritonSiluAndMul}


def use_triton_ops(model: nn.Module) -> None:
    """Make every RMSNorm, ApplyRotary and SiluAndMul of ``model`` its Triton subclass, in place."""
    for module in model.modules():
        if type(module) in TRITON_MODULES:
            module.__class__ = TRITON_MODULES[type(module)]
