"""The linear operators (GEMMs) of a transformer layer and their time on a GPU, from Vidur's profiles.

A layer's GEMMs on one GPU of a TP group (Megatron-style sharding: QKV and up/gate split by output
columns, the output and down projections by input rows):

* ``qkv_proj``: k = hidden, n = (heads + 2 kv heads) x head_dim / TP (kv heads at least 1 per GPU)
* ``o_proj``: k = heads x head_dim / TP, n = hidden
* ``mlp_up_gate``: k = hidden, n = 2 x FFN / TP (gated; one fused GEMM) or FFN / TP
* ``mlp_down``: k = FFN / TP, n = hidden

Each profiled (model, TP, operator) is one ``TokenCurve`` with shape (k, n); ``gemm_model`` puts all of a
GPU's curves (optionally leaving some models out) into one ``ShapeInterpolator``, which predicts any
(k, n) at any token count m (see curves.py). The per-token-count tables it builds keep the profiled
steps along m.
"""
from __future__ import annotations

from stallfree.engine.simulator.ops import profile_data
from stallfree.engine.simulator.ops.curves import ShapeInterpolator, TokenCurve
from stallfree.engine.simulator.shapes import ModelShape

# operator name -> Vidur's column
PROFILE_COLUMNS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "mlp_up_gate": "mlp_up_proj",
                   "mlp_down": "mlp_down_proj"}


def layer_gemms(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, gated: bool,
                tp: int) -> dict[str, tuple[int, int]]:
    """Operator name -> (k, n) of its GEMM on one GPU of the TP group."""
    q, kv = heads * head_dim // tp, max(1, kv_heads // tp) * head_dim
    return {"qkv_proj": (hidden, q + 2 * kv), "o_proj": (q, hidden),
            "mlp_up_gate": (hidden, (2 if gated else 1) * ffn // tp), "mlp_down": (ffn // tp, hidden)}


def shape_gemms(shape: ModelShape, tp: int) -> dict[str, tuple[int, int]]:
    return layer_gemms(shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                       shape.intermediate_size, shape.gated_mlp, tp)


def profile_gemms(row: dict[str, str], tp: int) -> dict[str, tuple[int, int]]:
    """The GEMM shapes of a profiled model, from a row of its profile (Vidur's column names)."""
    hidden, heads = int(row["n_embd"]), int(row["n_head"])
    return layer_gemms(hidden, heads, int(row["n_kv_head"]), hidden // heads, int(row["n_expanded_embd"]),
                       row["use_gated_mlp"] == "True", tp)


def gemm_curves(gpu: str, exclude_models: frozenset[str] = frozenset()) -> list[TokenCurve]:
    """One curve per profiled (model, TP, linear operator) on this GPU."""
    curves = []
    for model, tp, row, points in profile_data.profiled_configs(gpu, exclude_models):
        for op, column in PROFILE_COLUMNS.items():
            curves.append(TokenCurve.of(profile_gemms(row, tp)[op], points[tp, column],
                                        source=f"{model} tp{tp} {op}"))
    if not curves:
        raise ValueError(f"no GEMM profiles for gpu {gpu!r}")
    return curves


def gemm_model(gpu: str, exclude_models: frozenset[str] = frozenset()) -> ShapeInterpolator:
    return ShapeInterpolator(tuple(gemm_curves(gpu, exclude_models)))
