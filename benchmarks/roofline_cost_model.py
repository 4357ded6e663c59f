"""A cost model from a model's shape and a GPU's measured limits, for simulating hardware you cannot
profile on: each iteration reads the weights once at the device's bandwidth, its tokens' matmuls run at
a stated fraction of the matmul peak (MFU), attention over cached context is read at bandwidth (decodes)
or computed at a stated fraction of the peak (prefill chunks), plus a fixed per-iteration host cost.

It is an estimate of an engine at the hardware's limits, not a profile: ``fitted_on.source`` says
"roofline" and lists every assumption, and its residual spread is none. Replace it with
``stallfree-profile`` on the GPU when one is available.

    python benchmarks/roofline_cost_model.py --config path/to/config.json --out engine/simulator/fitting/cost_models/NAME.json
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from stallfree.engine import CostModel

# Measured on one NVIDIA H200 (torch 2.11+cu130) in this project's GPU runs: bf16 matmul and device copy.
H200 = {"peak_tflops": 788.0, "bandwidth_tb_s": 4.25}
# Prefill-only iterations of the 7B shape reached MFU 0.61 at 4096 tokens on that H200.
DEFAULT_MFU = 0.61


def matmul_params(cfg: dict) -> int:
    """Parameters every token multiplies through: attention and MLP projections of every layer, and the
    LM head (the embedding is a lookup)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q_dim, kv_dim = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    per_layer = h * q_dim + 2 * h * kv_dim + q_dim * h + 3 * h * inter
    return layers * per_layer + cfg["vocab_size"] * h


def roofline_cost_model(cfg: dict, *, peak_tflops: float, bandwidth_tb_s: float, mfu: float,
                        attention_efficiency: float, overhead_ms: float, dtype_bytes: int,
                        fitted_on: dict) -> CostModel:
    peak, bandwidth = peak_tflops * 1e12, bandwidth_tb_s * 1e12
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    layers, heads, kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tied = cfg.get("tie_word_embeddings", False)
    weight_bytes = (matmul_params(cfg) + (0 if tied else cfg["vocab_size"] * cfg["hidden_size"])) * dtype_bytes
    seconds_per_token = 2 * matmul_params(cfg) / (peak * mfu)
    coefficients = {
        "intercept": weight_bytes / bandwidth + overhead_ms / 1e3,
        "num_prefill_tokens": seconds_per_token,
        "num_decode_seqs": seconds_per_token,
        # QK^T and PV: 2 multiply-adds per (query, key) pair per head dimension, per head and layer
        "prefill_attention_work": 4 * layers * heads * head_dim / (peak * attention_efficiency),
        # a decode reads each cached token's K and V in every layer
        "decode_context_tokens": 2 * layers * kv_heads * head_dim * dtype_bytes / bandwidth,
    }
    return CostModel(coefficients=coefficients, fitted_on=fitted_on)  # the default residual: no spread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="an HF config.json of the model's shape")
    ap.add_argument("--device-name", default="NVIDIA H200")
    ap.add_argument("--peak-tflops", type=float, default=H200["peak_tflops"], help="measured matmul peak")
    ap.add_argument("--bandwidth-tb-s", type=float, default=H200["bandwidth_tb_s"], help="measured copy bandwidth")
    ap.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="fraction of the peak the token matmuls reach")
    ap.add_argument("--attention-efficiency", type=float, default=0.5,
                    help="fraction of the peak prefill attention reaches (assumed)")
    ap.add_argument("--overhead-ms", type=float, default=1.0, help="fixed host cost per iteration (assumed)")
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    assumptions = {k: v for k, v in vars(args).items() if k not in ("config", "out")}
    fitted_on = {"source": "roofline", "model_shape": {k: cfg[k] for k in (
                     "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size")},
                 "device": args.device_name, "assumptions": assumptions,
                 "date": datetime.date.today().isoformat(),
                 "note": "not a profile: estimated from the shape and the device's measured limits"}
    model = roofline_cost_model(cfg, peak_tflops=args.peak_tflops, bandwidth_tb_s=args.bandwidth_tb_s,
                                mfu=args.mfu, attention_efficiency=args.attention_efficiency,
                                overhead_ms=args.overhead_ms, dtype_bytes=args.dtype_bytes, fitted_on=fitted_on)
    model.save(args.out)
    decode_ms = {b: round(1e3 * (model.coefficients["intercept"] + b * model.coefficients["num_decode_seqs"]
                                 + b * 1024 * model.coefficients["decode_context_tokens"]), 2) for b in (1, 32, 128)}
    print(json.dumps({"out": str(args.out), "coefficients": model.coefficients,
                      "decode_ms_at_batch_with_1024_context": decode_ms}, indent=1))


if __name__ == "__main__":
    main()
