"""The decoder layer's element-wise ops on the CPU through the native kernels (engine/native/csrc/layer_ops.cpp).

Why: eager PyTorch runs RMSNorm, the residual adds, rotary and SiLU-and-mul as ~25 small ops per layer.
On the 2-core machines this project runs on they were ~15% of a `smollm2` decode step at batch 32 and
~11% of a 512-token prefill chunk (docs/performance.md). Each native module replaces its PyTorch
parent in place at load time, keeps its parameters, and writes into tensors the layer no longer needs.
"""
from __future__ import annotations

import ctypes

import torch
from torch import nn

from stallfree.engine.model.llama import ApplyRotary, RMSNorm, SiluAndMul
from stallfree.engine.native.cpu_kernels import KERNEL_SUFFIXES, load_cpu_kernels


def can_use_native_ops(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype in KERNEL_SUFFIXES and load_cpu_kernels() is not None


def _kernel(name: str, dtype: torch.dtype) -> ctypes._CFuncPtr:
    return getattr(load_cpu_kernels(), f"{name}_{KERNEL_SUFFIXES[dtype]}")


def _rows(x: torch.Tensor) -> int:
    assert x.dim() == 2 and x.stride(1) == 1, "rows of contiguous features"
    return x.shape[0]


class NativeRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        rows, dim = _rows(x), x.shape[1]
        kernel, threads = _kernel("rms_norm", x.dtype), torch.get_num_threads()
        if residual is None:
            out = torch.empty_like(x)
            kernel(x.data_ptr(), x.stride(0), None, out.data_ptr(), self.weight.data_ptr(), rows, dim, self.eps, 0, threads)
            return out
        assert residual.is_contiguous() and x.is_contiguous()
        # residual += x, then x = norm(residual): x is the sublayer's output, not needed after this
        kernel(x.data_ptr(), x.stride(0), residual.data_ptr(), x.data_ptr(), self.weight.data_ptr(), rows, dim,
               self.eps, 1, threads)
        return x, residual


class NativeApplyRotary(ApplyRotary):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        # q: [T, H, D], k: [T, Hkv, D], views of the fresh qkv projection: rotated in place
        cos, sin = cos_sin
        tokens, num_heads, head_dim = q.shape
        assert q.stride(1) == k.stride(1) == head_dim and q.stride(2) == k.stride(2) == 1
        assert cos.is_contiguous() and sin.is_contiguous() and cos.dtype == q.dtype
        _kernel("rotary", q.dtype)(q.data_ptr(), q.stride(0), num_heads, k.data_ptr(), k.stride(0), k.shape[1],
                                   cos.data_ptr(), sin.data_ptr(), tokens, head_dim, torch.get_num_threads())
        return q, k


class NativeSiluAndMul(SiluAndMul):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        assert gate_up.is_contiguous()
        rows, dim = _rows(gate_up), gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, dim)
        _kernel("silu_and_mul", gate_up.dtype)(gate_up.data_ptr(), out.data_ptr(), rows, dim, torch.get_num_threads())
        return out


NATIVE_MODULES: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: NativeRMSNorm, ApplyRotary: NativeApplyRotary, SiluAndMul: NativeSiluAndMul}


def use_native_ops(model: nn.Module) -> None:
    """Make every RMSNorm, ApplyRotary and SiluAndMul of ``model`` its native subclass, in place."""
    for module in model.modules():
        if type(module) in NATIVE_MODULES:
            module.__class__ = NATIVE_MODULES[type(module)]
