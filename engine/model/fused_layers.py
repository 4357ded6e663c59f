"""Each decoder layer in one native call (engine/native/csrc/decoder_layer.cpp) where every part of it is
native: the native norms and rotary, the cpu_paged attention backend, and either bf16 tiled linears (SiLU-and-mul
fused into gate_up) or, in fp32, widened linears (bf16 weights) with the native SiLU-and-mul.

Why: between two kernels, the layer's modules spent 14-30 us of Python each (module calls, views, output
allocations, ctypes arguments): 2.2 ms of a 24.4 ms `small` decode step at batch 32 on a 2-core Xeon, 3x
what the same Python takes with no kernel in between (docs/performance.md). The kernel calls the same
kernels in the same order on the same buffers, so the logits are the same bits; only the Python between
them is gone. Any other backend (a wrapped one included: the op-split sampler's timer) runs the modules.

Under tensor parallelism (o_proj and down_proj in AllReduceOutput) each layer is two native calls, split where
the modules all-reduce: attention up to o_proj, the all-reduce, the MLP up to down_proj, the all-reduce.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch
from torch import nn

from stallfree.engine.attention.cpu_paged import CPUPagedAttention
from stallfree.engine.attention.metadata import AttentionMetadata
from stallfree.engine.model.llama import DecoderLayer, LlamaForCausalLM
from stallfree.engine.model.native_ops import NativeApplyRotary, NativeRMSNorm, NativeSiluAndMul
from stallfree.engine.model.tensor_parallel import AllReduceOutput
from stallfree.engine.model.tiled_linear import TiledLinear
from stallfree.engine.model.widened_linear import WidenedLinear
from stallfree.engine.native.cpu_kernels import load_cpu_kernels

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class FusedLayerArgs(ctypes.Structure):
    """A layer's shapes and weights (``LayerArgs`` in decoder_layer.cpp), fixed at load."""

    _fields_ = [("hidden", _I), ("num_heads", _I), ("num_kv_heads", _I), ("head_dim", _I), ("intermediate", _I),
                ("eps", _F), ("input_norm", _P), ("post_norm", _P), ("qkv", _P), ("qkv_bias", _P), ("o", _P),
                ("gate_up", _P), ("down", _P)]


class FusedStepArgs(ctypes.Structure):
    """One forward pass's tokens, attention metadata and scratch (``StepArgs`` in decoder_layer.cpp)."""

    _fields_ = [("tokens", _I), ("cos", _P), ("sin", _P), ("slot_mapping", _P), ("block_tables", _P),
                ("query_start_loc", _P), ("seq_lens", _P), ("table_stride", _I), ("num_seqs", _I),
                ("num_blocks", _I), ("block_size", _I), ("scale", _F), ("qkv", _P), ("attn", _P), ("act", _P),
                ("num_threads", ctypes.c_int), ("gate_up", _P)]


def row_parallel(projection: nn.Module) -> tuple[nn.Module, bool, Any]:
    """A row-parallel projection's linear, whether its output is all-reduced, and over which group."""
    if type(projection) is AllReduceOutput:
        return projection.linear, True, projection.group
    return projection, False, None


def fused_kind(layer: DecoderLayer) -> str | None:
    """The native layer that runs ``layer`` (``bf16``: tiled linears; ``widened_f32``: widened linears), or None
    where a part of it is not native; o_proj and down_proj must be both sharded (all-reduced over the same group)
    or neither."""
    attn, mlp = layer.self_attn, layer.mlp
    (o_proj, *o_reduce), (down_proj, *down_reduce) = row_parallel(attn.o_proj), row_parallel(mlp.down_proj)
    plain = [attn.qkv_proj, o_proj, down_proj]
    if not (o_reduce == down_reduce
            and all(type(norm) is NativeRMSNorm for norm in (layer.input_layernorm, layer.post_attention_layernorm))
            and layer.input_layernorm.eps == layer.post_attention_layernorm.eps
            and type(attn.rotary) is NativeApplyRotary
            and o_proj.bias is None and mlp.gate_up_proj.bias is None and down_proj.bias is None):
        return None
    if (type(mlp.act) is nn.Identity and all(type(linear) is TiledLinear and not linear.silu_and_mul for linear in plain)
            and type(mlp.gate_up_proj) is TiledLinear and mlp.gate_up_proj.silu_and_mul):
        return "bf16"
    if type(mlp.act) is NativeSiluAndMul and all(type(linear) is WidenedLinear for linear in [*plain, mlp.gate_up_proj]):
        return "widened_f32"
    return None


def layer_args(layer: DecoderLayer) -> FusedLayerArgs:
    attn, mlp = layer.self_attn, layer.mlp
    (o_proj, *_), (down_proj, *_) = row_parallel(attn.o_proj), row_parallel(mlp.down_proj)
    bias = attn.qkv_proj.bias
    return FusedLayerArgs(
        o_proj.out_features, attn.num_heads, attn.num_kv_heads, attn.head_dim, down_proj.in_features,
        layer.input_layernorm.eps, layer.input_layernorm.weight.data_ptr(),
        layer.post_attention_layernorm.weight.data_ptr(), attn.qkv_proj.packed_weight.data_ptr(),
        None if bias is None else bias.data_ptr(), o_proj.packed_weight.data_ptr(),
        mlp.gate_up_proj.packed_weight.data_ptr(), down_proj.packed_weight.data_ptr())


class FusedLayerKernels:
    """The native calls of one kind of layer (``decoder_layer_<kind>`` and its two halves)."""

    def __init__(self, kind: str):
        lib = load_cpu_kernels()
        self.whole, self.attention, self.mlp = (getattr(lib, f"decoder_layer{part}_{kind}")
                                                for part in ("", "_attention", "_mlp"))


class FusedLlamaForCausalLM(LlamaForCausalLM):
    """The model with ``run_layers`` in native calls. ``fused = False`` runs the layers' modules instead
    (e.g. to time them one by one, as benchmarks/decode_step.py does). ``tp_reduced``: the layers are
    tensor-parallel shards, whose halves' outputs are all-reduced over ``tp_group``."""

    fused_args: list[FusedLayerArgs]
    fused_kind: str
    fused_kernels: FusedLayerKernels
    fused: bool
    tp_reduced: bool
    tp_group: Any

    def run_layers(self, x, cos_sin, attn_backend, kv_caches, meta: AttentionMetadata,
                   residual: torch.Tensor | None = None):
        if not self.fused or type(attn_backend) is not CPUPagedAttention:
            return super().run_layers(x, cos_sin, attn_backend, kv_caches, meta, residual)
        first_layer = residual is None  # else a previous pipeline stage's stream, added by the first layer here
        first = self.fused_args[0]
        tokens = x.shape[0]
        q_size = first.num_heads * first.head_dim
        qkv = x.new_empty(tokens, q_size + 2 * first.num_kv_heads * first.head_dim)
        attn, act = x.new_empty(tokens, q_size), x.new_empty(tokens, first.intermediate)
        gate_up = x.new_empty(tokens, 2 * first.intermediate) if self.fused_kind == "widened_f32" else None
        residual = torch.empty_like(x) if residual is None else residual.clone()
        (cos, sin), tables = cos_sin, meta.block_tables
        _, num_blocks, block_size, _ = kv_caches[0][0].shape
        step = FusedStepArgs(tokens, cos.data_ptr(), sin.data_ptr(), meta.slot_mapping.data_ptr(), tables.data_ptr(),
                             meta.query_start_loc.data_ptr(), meta.seq_lens.data_ptr(), tables.stride(0),
                             meta.seq_lens.shape[0], num_blocks, block_size, attn_backend.scale, qkv.data_ptr(),
                             attn.data_ptr(), act.data_ptr(), torch.get_num_threads(),
                             None if gate_up is None else gate_up.data_ptr())
        kernels, step_ref = self.fused_kernels, ctypes.byref(step)
        for i, (args, (k_cache, v_cache)) in enumerate(zip(self.fused_args, kv_caches, strict=True)):
            args_ref, buffers = ctypes.byref(args), (x.data_ptr(), residual.data_ptr())
            cache = (k_cache.data_ptr(), v_cache.data_ptr(), int(i == 0 and first_layer))
            if not self.tp_reduced:
                failed = kernels.whole(args_ref, step_ref, *buffers, *cache)
            elif not (failed := kernels.attention(args_ref, step_ref, *buffers, *cache)):
                torch.distributed.all_reduce(x, group=self.tp_group)
                failed = kernels.mlp(args_ref, step_ref, *buffers)
                torch.distributed.all_reduce(x, group=self.tp_group)
            if failed:
                raise RuntimeError("the native decoder layer cannot run here (the head dim)")
        return x, residual


def fuse_layers(model: LlamaForCausalLM) -> None:
    """Make ``model`` a FusedLlamaForCausalLM, in place, if every layer can run natively."""
    kinds = {fused_kind(layer) for layer in model.layers}
    if type(model) is LlamaForCausalLM and len(kinds) == 1 and None not in kinds:
        model.__class__ = FusedLlamaForCausalLM
        model.fused_kind = kinds.pop()
        model.fused_kernels = FusedLayerKernels(model.fused_kind)
        model.fused_args = [layer_args(layer) for layer in model.layers]
        model.fused = True
        _, model.tp_reduced, model.tp_group = row_parallel(model.layers[0].self_attn.o_proj)
