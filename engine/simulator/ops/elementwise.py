"""The memory-bound operators of a layer (norms, rotary embedding, the MLP activation, the residual add)
and the embedding lookup, from Vidur's profiles.

Each is a function of the token count and its width on one GPU (elements per token):

* ``norm`` (RMSNorm/LayerNorm; the norms are not sharded by TP): hidden
* ``rotary`` (applied to the GPU's query and key heads): (heads + kv heads) / TP x head_dim
* ``mlp_act`` (SiLU x up, or GELU): its input, 2 x FFN / TP gated or FFN / TP
* ``residual`` (the add): hidden
* ``embedding`` (the vocabulary-parallel lookup): hidden

Every profiled (model, TP) gives one curve per operator; an unprofiled width is interpolated in log
width from the nearest profiled ones at each token count (curves.py), as the GEMMs are.
"""
from __future__ import annotations

from collections import defaultdict

from stallfree.engine.simulator.ops import profile_data
from stallfree.engine.simulator.ops.curves import ShapeInterpolator, TokenCurve
from stallfree.engine.simulator.shapes import ModelShape

# operator -> Vidur's columns measuring it (both norms of a layer measure the same operator)
PROFILE_COLUMNS = {"norm": ("input_layernorm", "post_attention_layernorm"), "rotary": ("attn_rope",),
                   "mlp_act": ("mlp_act",), "residual": ("add",), "embedding": ("emb",)}


def widths(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, gated: bool, tp: int) -> dict[str, int]:
    return {"norm": hidden, "rotary": (heads // tp + max(1, kv_heads // tp)) * head_dim,
            "mlp_act": (2 if gated else 1) * ffn // tp, "residual": hidden, "embedding": hidden}


def shape_widths(shape: ModelShape, tp: int) -> dict[str, int]:
    return widths(shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.intermediate_size,
                  shape.gated_mlp, tp)


def elementwise_models(gpu: str, exclude_models: frozenset[str] = frozenset()) -> dict[str, ShapeInterpolator]:
    """Operator -> an interpolator over every profiled (model, TP) curve of it on this GPU."""
    curves: dict[str, list[TokenCurve]] = defaultdict(list)
    for model, tp, row, points in profile_data.profiled_configs(gpu, exclude_models):
        hidden, heads = int(row["n_embd"]), int(row["n_head"])
        op_widths = widths(hidden, heads, int(row["n_kv_head"]), hidden // heads, int(row["n_expanded_embd"]),
                           row["use_gated_mlp"] == "True", tp)
        for op, columns in PROFILE_COLUMNS.items():
            for column in columns:
                if (tp, column) in points:  # phi-2 has one norm per layer
                    curves[op].append(TokenCurve.of((op_widths[op],), points[tp, column],
                                                    source=f"{model} tp{tp} {column}"))
    if not curves:
        raise ValueError(f"no elementwise profiles for gpu {gpu!r}")
    return {op: ShapeInterpolator(tuple(c)) for op, c in curves.items()}
