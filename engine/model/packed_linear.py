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

import logging
import os
import time
from collections.abc import Callable

import torch
from torch import nn

from stallfree.engine.device import cpu_has_fast_bf16

log = logging.getLogger(__name__)

# oneDNN, and ideep in front of it, cache a primitive per input shape (1,024 each by default), each
# holding its own reordered copy of the weight. A server sees hundreds of batch sizes: a 30-minute soak
# of `tiny` grew by 65 MiB, and 1,200 sizes through four small linears took 1.3 GB. With 16 entries
# RSS stayed bounded and steps were no slower. Read when oneDNN first runs, so set before that; a value
# already in the environment wins.
PRIMITIVE_CACHE_CAPACITY = "16"

# oneDNN's packed kernels fall off a cliff at some row counts on some shapes: on a 2-core Xeon with AMX,
# `small`'s o and down projections (768 outputs) ran 448-736 rows 1.4-1.7x slower than F.linear, yet 384
# rows 1.1-1.2x faster, while its qkv and gate_up projections ran fastest whole (docs/performance.md). So
# each shape is timed once at load on a whole-budget prefill chunk, whole and in pieces of at most
# PIECE_ROWS rows, and runs large inputs in pieces where that was SPLIT_GAIN faster.
PIECE_ROWS = 384
TUNE_ROWS = 512
SPLIT_GAIN = 1.1
_SPLIT_CHOICES: dict[tuple, bool] = {}  # (in, out, dtype, threads) -> split, as timed in this process


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
        self.piece_rows: int | None = None  # run inputs of more rows in pieces (set by tune_pieces)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.piece_rows is None or x.dim() != 2 or x.shape[0] <= self.piece_rows:
            return self._whole(x)
        return self._in_pieces(x, self.piece_rows)

    def _whole(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def _in_pieces(self, x: torch.Tensor, piece_rows: int) -> torch.Tensor:
        return torch.cat([self._whole(part) for part in x.tensor_split(-(-x.shape[0] // piece_rows))])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module] = PackedLinear) -> None:
    """Replace every ``nn.Linear`` in ``model`` with ``make(linear)`` (a PackedLinear), in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, make(child))


def tune_pieces(linears: list[PackedLinear], dtype: torch.dtype) -> dict[tuple[int, int], bool]:
    """Time each distinct shape of ``linears`` at TUNE_ROWS rows, whole and in pieces; set ``piece_rows``
    on those where the pieces won by SPLIT_GAIN. Returns (in, out) features -> split."""
    by_shape: dict[tuple[int, int], list[PackedLinear]] = {}
    for linear in linears:
        by_shape.setdefault((linear.in_features, linear.out_features), []).append(linear)
    choices = {}
    with torch.inference_mode():
        for shape, group in by_shape.items():
            key = (*shape, dtype, torch.get_num_threads())
            if key not in _SPLIT_CHOICES:  # engines built one after another in a process time each shape once
                layer, x = group[0], torch.randn(TUNE_ROWS, shape[0], dtype=dtype)
                whole = _best_seconds(lambda layer=layer, x=x: layer._whole(x))
                pieces = _best_seconds(lambda layer=layer, x=x: layer._in_pieces(x, PIECE_ROWS))
                _SPLIT_CHOICES[key] = whole > SPLIT_GAIN * pieces
            for linear in group:
                linear.piece_rows = PIECE_ROWS if _SPLIT_CHOICES[key] else None
            choices[shape] = _SPLIT_CHOICES[key]
    if any(choices.values()):
        log.info("packed linears of (in, out) features %s run inputs of over %d rows in pieces",
                 [shape for shape, split in choices.items() if split], PIECE_ROWS)
    return choices


def _best_seconds(fn, calls: int = 4, trials: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best
