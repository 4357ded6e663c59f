"""Load HF safetensors checkpoints into the engine's model (fusing q/k/v and gate/up projections)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.fused_layers import fuse_layers
from stallfree.engine.model.llama import LlamaForCausalLM
from stallfree.engine.model.native_ops import can_use_native_ops, use_native_ops
from stallfree.engine.model.packed_linear import PackedLinear, can_pack, pack_linears, tune_pieces
from stallfree.engine.model.stages import PipelineStage
from stallfree.engine.model.tensor_parallel import TensorParallel, reduce_row_parallel, split_vocab
from stallfree.engine.model.tiled_linear import (
    TiledLinear,
    can_use_tiled_linear,
    fuse_silu_and_mul,
    linear_path,
)
from stallfree.engine.model.triton_ops import can_use_triton_ops, use_triton_ops
from stallfree.engine.model.widened_linear import WidenedLinear, can_widen

# HF parameter name suffix -> (engine parameter suffix, index of the part inside a fused tensor)
FUSED_PARTS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def linear_kernels(model: torch.nn.Module) -> str:
    """Which kernel runs ``model``'s linears, for startup lines: ``tiled/<path>`` (engine/model/tiled_linear.py:
    amx, avx512_bf16), ``widened/bf16-weights`` (engine/model/widened_linear.py), ``onednn`` (packed), or
    ``torch``."""
    kinds = {type(module) for module in model.modules()}
    if TiledLinear in kinds:
        return f"tiled/{linear_path()}"
    if WidenedLinear in kinds:
        return "widened/bf16-weights"
    return "onednn" if PackedLinear in kinds else "torch"


def weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weights found")
    return files


def read_checkpoint(files: list[Path], tp: TensorParallel | None = None, stage: PipelineStage | None = None,
                    tied: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of ``files``; with ``tp`` this rank's slice of each, with ``stage`` only the tensors it holds
    (``tied``: the last stage's LM head is the embedding). Only those are read."""
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)) if tp is None and stage is None else read_shard(f, tp, stage, tied))
        except Exception as exc:  # SafetensorError, OSError, ...: none of them names the file
            raise ValueError(f"{f}: not a readable safetensors file ({exc})") from None
    return tensors


def read_shard(file: Path, tp: TensorParallel | None, stage: PipelineStage | None = None,
               tied: bool = False) -> dict[str, torch.Tensor]:
    with safe_open(str(file), framework="pt") as handle:
        tensors = {}
        for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            if stage is not None and stage.local_name(name.removeprefix("model."), tied) is None:
                continue  # another stage's weight
            part = handle.get_slice(name)
            index = None if tp is None else tp.slice_of(name, part.get_shape())
            tensors[name] = part[:] if index is None else part[index]
        return tensors


def to_engine_names(tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("model.")
        for hf_part, (engine_part, index) in FUSED_PARTS.items():
            if f".{hf_part}." in name:
                fused.setdefault(name.replace(hf_part, engine_part), {})[index] = tensor
                break
        else:
            out[name] = tensor
    for name, parts in fused.items():
        widths = {tuple(p.shape[1:]) for p in parts.values()}
        if len(widths) > 1:
            raise ValueError(f"{source}: the parts fused into {name} differ in shape: "
                             f"{[list(parts[i].shape) for i in sorted(parts)]}")
        out[name] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
    return out


def check_shapes(state: dict[str, torch.Tensor], model: LlamaForCausalLM) -> str | None:
    """The first weight whose shape differs from what config.json implies, described; None if all match."""
    for name, expected in model.state_dict().items():
        if name in state and tuple(state[name].shape) != tuple(expected.shape):
            return f"{name} has shape {list(state[name].shape)}, config.json implies {list(expected.shape)}"
    return None


def load_model(path: Path, cfg: ArchConfig, max_len: int, dtype: torch.dtype, device: torch.device,
               tp: TensorParallel | None = None, stage: PipelineStage | None = None,
               weight_dtype: torch.dtype | None = None) -> LlamaForCausalLM:
    """The checkpoint at ``path`` as a model; with ``tp`` this rank's tensor-parallel shard of it, with
    ``stage`` one pipeline stage of it (its layers, renumbered from 0). ``weight_dtype=bfloat16`` with an fp32
    ``dtype``: every weight rounded to bf16, the linears' kept in 16 bits (engine/model/widened_linear.py)."""
    if tp is not None:
        cfg = tp.shard_arch(cfg)
    tied = cfg.tie_word_embeddings
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_len, stage)
    files = weight_files(path)
    weights = str(files[0]) if len(files) == 1 else f"{path}/*.safetensors"
    state = to_engine_names(read_checkpoint(files, tp, stage, tied), source=weights)
    if tied:
        state.pop("lm_head.weight", None)
    state = {local: tensor for name, tensor in state.items()
             if (local := model.stage.local_name(name, tied)) is not None}
    tied_here = tied and model.stage.first and model.stage.last  # the LM head is the embedding itself
    expected = {k for k in model.state_dict() if not (tied_here and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ValueError(f"{weights}: checkpoint does not match {cfg.architecture}: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    if (mismatch := check_shapes(state, model)) is not None:
        raise ValueError(f"{weights}: weights do not match {path / 'config.json'}: {mismatch}")
    model.load_state_dict(state, assign=True, strict=False)
    if tied_here:
        model.lm_head.weight = model.embed_tokens.weight
    # Buffers (RoPE tables) were created on the meta device: rebuild them for real.
    model.rotary = type(model.rotary)(cfg, max_len)
    model = model.to(device=device, dtype=dtype).eval()
    if weight_dtype is not None:  # the weights as 16 bits hold them (the RoPE tables are not weights)
        for param in model.parameters():
            param.data = param.data.to(weight_dtype).to(dtype)
    if tp is not None:  # before packing: the tiled linears take the sharded weights inside the all-reduces
        reduce_row_parallel(model, tp)
    if weight_dtype is not None and can_pack(device, dtype):
        pack_linears(model, lambda linear: WidenedLinear(linear) if can_widen(linear) else PackedLinear(linear))
    elif can_pack(device, dtype):
        # The tiled kernel (AMX or AVX512-BF16) where the shape tiles: in the model, faster than oneDNN at decode
        # steps (engine/model/tiled_linear.py)
        fuse_silu_and_mul(model, device, dtype)
        lm_head = model.lm_head if model.stage.last else None  # its logits come out in fp32, as the model returns them
        pack_linears(model, lambda linear: TiledLinear(linear, float_output=linear is lm_head)
                     if can_use_tiled_linear(device, dtype, linear) else PackedLinear(linear))
        tune_pieces([m for m in model.layers.modules() if isinstance(m, PackedLinear)], dtype)
    if can_use_native_ops(device, dtype):
        use_native_ops(model)
        fuse_layers(model)  # where every part of each layer is native now (engine/model/fused_layers.py)
    if can_use_triton_ops(device):
        use_triton_ops(model)
    if tp is not None:  # after packing: the packed LM head is the one whose slices are gathered
        split_vocab(model, tp)
    return model
