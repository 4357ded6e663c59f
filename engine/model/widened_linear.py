"""fp32 linears whose weights are stored in bf16 (the tiled layout of engine/native/csrc/linear_tiled.h) and
widened to fp32 in the kernel (engine/native/csrc/linear_widened.cpp): what ``model.dtype=bfloat16`` means on a
CPU without native bf16.

Why: there bf16 matmuls are emulated (~100x slower than fp32), so the model computes in fp32; but a decode step
is bound by the bytes of weight it reads, and in bf16 they are half. The inputs, sums and outputs stay fp32, so
the model computes what an fp32 model with its weights rounded to bf16 computes.
"""
from __future__ import annotations

import torch
from torch import nn

from stallfree.engine.model.tiled_linear import TILE_IN, TILE_OUT
from stallfree.engine.native.cpu_kernels import load_cpu_kernels


def can_widen(linear: nn.Linear) -> bool:
    """The kernel builds here and ``linear``'s shape tiles (a multiple of 32 inputs and outputs)."""
    return (load_cpu_kernels() is not None and linear.in_features % TILE_IN == 0
            and linear.out_features % TILE_OUT == 0)


class WidenedLinear(nn.Module):
    """``nn.Linear`` inference in fp32 from a bf16 copy of the weight in tile order (no ``weight``)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16).contiguous()
        self.packed_weight = torch.empty(weight.numel(), dtype=torch.bfloat16)
        load_cpu_kernels().linear_tiled_pack(weight.data_ptr(), self.out_features, self.in_features,
                                             self.packed_weight.data_ptr())
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        out = rows.new_empty(rows.shape[0], self.out_features)
        load_cpu_kernels().linear_widened_f32(
            rows.data_ptr(), rows.shape[0], self.in_features, self.packed_weight.data_ptr(), self.out_features,
            None if self.bias is None else self.bias.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, weights=bf16"
