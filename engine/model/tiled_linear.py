"""bf16 linears through the native tiled kernel (engine/native/csrc/linear_tiled.cpp), with the weight packed
once at load in the order the kernel streams it, on the best path the CPU has: AMX tiles, else AVX512-BF16
dot products (``linear_path``).

Why: a decode step's linears are a pass over the weights. On a 2-core Xeon with AMX, oneDNN's packed
kernel read `small`'s 151 MB of decode-step weights at 17 GB/s (8.7 ms at 32 rows) where the cores read
31 GB/s; the AMX path read them at 31 GB/s (4.8 ms), and ran 512-token prefill chunks as fast as oneDNN
(60-63 vs 61 ms), so it takes every row count and the weight is held once (docs/performance.md). On a 2-core
EPYC with AVX512-BF16 and no AMX, the AVX-512 path reads them faster than oneDNN's packed bf16 kernel too. The
MLP's gate_up projection also applies SiLU-and-mul as it writes its output (``fuse_silu_and_mul``), which
saves a pass over the widest activation of the layer. Where the CPU has neither, or a shape does not tile,
PackedLinear (oneDNN) stays.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn

from stallfree.engine.model.llama import MLP, SiluAndMul
from stallfree.engine.native.cpu_kernels import load_cpu_kernels

TILE_OUT, TILE_IN = 32, 32  # the kernel's panel of output features and its depth of input features
BF16, SILU_AND_MUL, FLOAT = 0, 1, 2  # what the kernel writes (Epilogue in csrc/linear_tiled.h)
PATHS = ("reference", "avx512_bf16", "amx")  # the kernel's paths by ISA (Path in csrc/linear_tiled.h), worst first


def can_use_tiled_linear(device: torch.device, dtype: torch.dtype, linear: nn.Linear) -> bool:
    """The kernel runs here on a fast path (AMX or AVX512-BF16), bf16, and ``linear``'s shape tiles."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not fast_path_available():
        return False
    return linear.in_features % TILE_IN == 0 and linear.out_features % TILE_OUT == 0


def linear_path() -> str | None:
    """The path the kernel runs now (one of PATHS), or None where the native kernels do not build."""
    lib = load_cpu_kernels()
    return None if lib is None else PATHS[lib.linear_tiled_path()]


@functools.cache
def fast_path_available() -> bool:
    """The CPU has a path faster than oneDNN's (AMX or AVX512-BF16); the reference loop is not one."""
    lib = load_cpu_kernels()
    return lib is not None and lib.linear_tiled_path() > 0


@contextlib.contextmanager
def forced_linear_path(path: str) -> Iterator[None]:
    """Run every tiled linear of this process on ``path`` (one of PATHS) inside the block; ValueError where the
    CPU cannot run it. For tests and A/B measurements."""
    lib = load_cpu_kernels()
    if lib is None or lib.linear_tiled_select(PATHS.index(path)) != 0:
        raise ValueError(f"the tiled linear's {path} path cannot run on this CPU")
    try:
        yield
    finally:
        lib.linear_tiled_select(-1)


class TiledLinear(nn.Module):
    """``nn.Linear`` inference in bf16 on the tiled kernel, the weight held in its tile order (no ``weight``).

    ``silu_and_mul``: ``linear`` is a fused [gate | up] projection, and the output is silu(gate) * up (half
    its features), rounded where the unfused ops round. ``float_output``: the bf16 output's values in fp32
    (the model's lm_head: sampling reads fp32 logits, and a separate ``.float()`` pass was ~1% of a decode
    step)."""

    def __init__(self, linear: nn.Linear, silu_and_mul: bool = False, float_output: bool = False):
        super().__init__()
        weight = linear.weight.detach().to(torch.bfloat16)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        if silu_and_mul:  # each 32-feature panel: 16 gate features, then the same 16 up features
            order = torch.arange(linear.out_features).view(2, -1, 16).transpose(0, 1).flatten()
            weight = weight[order]
            bias = None if bias is None else bias[order]
        self.silu_and_mul, self.float_output = silu_and_mul, float_output
        self.in_features = linear.in_features
        self.out_features = linear.out_features // 2 if silu_and_mul else linear.out_features
        self.packed_weight = torch.empty(weight.numel(), dtype=torch.bfloat16)
        load_cpu_kernels().linear_tiled_pack(weight.contiguous().data_ptr(), linear.out_features, self.in_features,
                                           self.packed_weight.data_ptr())
        self.bias = None if bias is None else bias.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        out = rows.new_empty(rows.shape[0], self.out_features, dtype=torch.float32 if self.float_output else None)
        load_cpu_kernels().linear_tiled_bf16(
            rows.data_ptr(), rows.shape[0], self.in_features, self.packed_weight.data_ptr(),
            2 * self.out_features if self.silu_and_mul else self.out_features,
            None if self.bias is None else self.bias.data_ptr(),
            SILU_AND_MUL if self.silu_and_mul else FLOAT if self.float_output else BF16, out.data_ptr(),
            torch.get_num_threads())
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                + (", silu_and_mul=True" if self.silu_and_mul else "") + (", float_output=True" if self.float_output else ""))


def fuse_silu_and_mul(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give each MLP whose gate_up projection runs on the tiled kernel a TiledLinear that applies SiLU-and-mul itself
    (its ``act`` becomes the identity), in place."""
    for mlp in model.modules():
        linear = getattr(mlp, "gate_up_proj", None)
        if (isinstance(mlp, MLP) and type(mlp.act) is SiluAndMul and isinstance(linear, nn.Linear)
                and can_use_tiled_linear(device, dtype, linear)):
            mlp.gate_up_proj, mlp.act = TiledLinear(linear, silu_and_mul=True), nn.Identity()
