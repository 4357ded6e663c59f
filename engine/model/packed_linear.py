"""CPU linears through oneDNN with weights reordered once at load time (fp32, and bf16 where the CPU
has native bf16 matmuls).

Why: PyTorch sends an fp32 ``F.linear`` to MKL's sgemm, which on the AMD EPYC machines this project
runs on reaches 15-30 GFLOP/s for the few-row inputs of decode steps. oneDNN with a prepacked
weight ran the same shapes 2-3x faster there (decode step of ``small`` at batch 8: 169 -> 77 ms). A
bf16 ``F.linear`` already runs on oneDNN, but without a prepacked weight: on a 2-core AVX512-BF16 EPYC,
packing ran ``small``'s five projections 1.8x faster at 1-8 rows, 1.3x at 32 and 1.07x at 512
(``benchmarks/packed_linear.py``, docs/performance.md).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from stallfree.engine.device import cpu_has_fast_bf16

# oneDNN, and ideep in front of it, cache a primitive per input shape (1,024 each by default), each
# holding its own reordered copy of the weight. A server sees hundreds of batch sizes: a 30-minute soak
# of `tiny` grew by 65 MiB, and 1,200 sizes through four small linears took 1.3 GB. With 16 entries
# RSS stayed bounded and steps were no slower. Read when oneDNN first runs, so set before that; a value
# already in the environment wins.
PRIMITIVE_CACHE_CAPACITY = "16"


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    # Without native bf16 (AVX512-BF16 / AMX) oneDNN emulates bf16 matmuls: such CPUs run models in fp32.
    return dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_has_fast_bf16())


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
