"""fp32 linears on the CPU through oneDNN with weights reordered once at load time.

Why: PyTorch sends an fp32 ``F.linear`` to MKL's sgemm, which on the AMD EPYC machines this project
runs on reaches 15-30 GFLOP/s for the few-row inputs of decode steps. oneDNN with a prepacked
weight ran the same shapes 2-3x faster there (decode step of ``small`` at batch 8: 169 -> 77 ms;
docs/performance.md). bf16 already goes through oneDNN, so only fp32 is packed.
"""
from __future__ import annotations

import os

import torch
from torch import nn

# oneDNN, and ideep in front of it, cache a primitive per input shape (1,024 each by default), each
# holding its own reordered copy of the weight. A server sees hundreds of batch sizes: a 30-minute soak
# of `tiny` grew by 65 MiB, and 1,200 sizes through four small linears took 1.3 GB. With 16 entries
# RSS stayed bounded and steps were no slower. Read when oneDNN first runs, so set before that; a value
# already in the environment wins.
PRIMITIVE_CACHE_CAPACITY = "16"


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """``nn.Linear`` inference with the weight held in oneDNN's blocked layout (no ``weight`` tensor)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        for variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
            os.environ.setdefault(variable, PRIMITIVE_CACHE_CAPACITY)
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
