"""fp32 linears on the CPU through oneDNN with weights reordered once at load time.

Why: PyTorch sends an fp32 ``F.linear`` to MKL's sgemm, which on the AMD EPYC machines this project
runs on reaches 15-30 GFLOP/s for the few-row inputs of decode steps. oneDNN with a prepacked
weight ran the same shapes 2-3x faster there (decode step of ``small`` at batch 8: 169 -> 77 ms;
docs/performance.md). bf16 already goes through oneDNN, so only fp32 is packed.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """``nn.Linear`` inference with the weight held in oneDNN's blocked layout (no ``weight`` tensor)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # None: pack for any number of input rows (decode steps and prefill chunks share the weight)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: nn.Module) -> None:
    """Replace every ``nn.Linear`` in ``model`` with a PackedLinear, in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))
