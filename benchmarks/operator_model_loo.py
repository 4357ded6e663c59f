"""Leave-one-model-out accuracy of the simulator's GEMM model (engine/simulator/ops/linear.py).

For every profiled model on A100 and H100: build the GEMM model from the other models' profiles on that
GPU, predict the held-out model's per-layer linear operators (QKV, output, MLP up/gate, MLP down) at TP
1, 2 and 4 at every profiled token count, and compare with its measured times. Errors are |predicted /
measured - 1| per (operator, TP, token count); the "layer" rows compare the sum of the four per (TP,
token count). The stricter "leave-shape-out" variant also drops every other model's curve of the exact
same (k, n) (Llama-2-70B and Llama-3-70B share all their GEMM shapes; CodeLlama-34B shares their
attention projections), so every prediction is of a shape the model never saw. The "roofline" baseline
is what a smooth model gets on the same held-out points: seconds = a + b k n + c m k n (launch, weight
streaming, FLOPs), fitted on the other models by relative least squares; it has no tile steps.

    python -m benchmarks.operator_model_loo     # prints a table, writes benchmarks/results/operator_model_loo.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from stallfree.engine.simulator.ops import profile_data
from stallfree.engine.simulator.ops.curves import ShapeInterpolator, TokenCurve
from stallfree.engine.simulator.ops.linear import gemm_curves

GPUS = ("a100", "h100")
TPS = (1, 2, 4)
TARGET = {"median_abs_pct": 8.0, "p90_abs_pct": 20.0}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(errors: list[float]) -> dict:
    pct = [abs(e) * 100 for e in errors]
    return {"points": len(pct), "median_abs_pct": round(statistics.median(pct), 2),
            "p90_abs_pct": round(quantile(pct, 0.9), 2), "max_abs_pct": round(max(pct), 1),
            "mean_signed_pct": round(statistics.fmean(errors) * 100, 2)}


class Roofline:
    """The smooth baseline: seconds = a + b k n + c m k n, fitted by relative least squares."""

    def __init__(self, curves: tuple[TokenCurve, ...]):
        x, t = [], []
        for c in curves:
            for m, s in zip(c.token_counts, c.seconds, strict=True):
                x.append(self.features(m, c.shape))
                t.append(s)
        xs, ts = np.asarray(x), np.asarray(t)
        self.coef = np.linalg.lstsq(xs / ts[:, None], np.ones(len(ts)), rcond=None)[0]

    @staticmethod
    def features(m: int, shape: tuple[int, int]) -> list[float]:
        return [1.0, shape[0] * shape[1], m * shape[0] * shape[1]]

    def table_at(self, shape: tuple[int, int], token_counts) -> list[float]:
        return [float(np.dot(self.coef, self.features(m, shape))) for m in token_counts]


def held_out_errors(gpu: str, model: str, variant: str) -> tuple[list[float], list[float]]:
    """Per-operator and per-layer relative errors of the held-out model on this GPU."""
    all_curves = gemm_curves(gpu)
    train = tuple(c for c in all_curves if not c.source.startswith(f"{model} "))
    roofline = Roofline(train) if variant == "roofline" else None
    ops, layer = [], defaultdict(lambda: [0.0, 0.0])
    for curve in all_curves:
        name, tp, _ = curve.source.split(" ")
        if name != model or int(tp.removeprefix("tp")) not in TPS:
            continue
        if roofline is not None:
            predictor = roofline
        else:
            predictor = ShapeInterpolator(tuple(c for c in train if c.shape != curve.shape)
                                          if variant == "leave-shape-out" else train)
        for m, measured, predicted in zip(curve.token_counts, curve.seconds,
                                          predictor.table_at(curve.shape, curve.token_counts), strict=True):
            ops.append(predicted / measured - 1)
            layer[tp, m][0] += predicted
            layer[tp, m][1] += measured
    return ops, [p / m - 1 for p, m in layer.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/operator_model_loo.json"))
    args = ap.parse_args()
    result: dict = {"target": TARGET, "tps": TPS, "variants": {}}
    print(f"{'variant':<17} {'gpu':<5} {'held-out model':<27} {'op med%':>8} {'op p90%':>8} {'layer med%':>10} "
          f"{'layer p90%':>10}")
    for variant in ("leave-model-out", "leave-shape-out", "roofline"):
        by_gpu, everything = {}, ([], [])
        for gpu in GPUS:
            models, gpu_ops, gpu_layers = {}, [], []
            for file in profile_data.compute_files(gpu):
                model = profile_data.model_name(file)
                ops, layers = held_out_errors(gpu, model, variant)
                models[model] = {"operators": summary(ops), "layer": summary(layers)}
                gpu_ops += ops
                gpu_layers += layers
                print(f"{variant:<17} {gpu:<5} {model:<27} {models[model]['operators']['median_abs_pct']:>8} "
                      f"{models[model]['operators']['p90_abs_pct']:>8} {models[model]['layer']['median_abs_pct']:>10} "
                      f"{models[model]['layer']['p90_abs_pct']:>10}")
            by_gpu[gpu] = {"operators": summary(gpu_ops), "layer": summary(gpu_layers), "models": models}
            everything[0].extend(gpu_ops)
            everything[1].extend(gpu_layers)
            print(f"{variant:<17} {gpu:<5} {'ALL':<27} {by_gpu[gpu]['operators']['median_abs_pct']:>8} "
                  f"{by_gpu[gpu]['operators']['p90_abs_pct']:>8} {by_gpu[gpu]['layer']['median_abs_pct']:>10} "
                  f"{by_gpu[gpu]['layer']['p90_abs_pct']:>10}")
        overall = {"operators": summary(everything[0]), "layer": summary(everything[1])}
        print(f"{variant:<17} {'both':<5} {'ALL':<27} {overall['operators']['median_abs_pct']:>8} "
              f"{overall['operators']['p90_abs_pct']:>8} {overall['layer']['median_abs_pct']:>10} "
              f"{overall['layer']['p90_abs_pct']:>10}")
        result["variants"][variant] = {"overall": overall, "gpus": by_gpu}
    primary = result["variants"]["leave-model-out"]["overall"]["operators"]
    result["target_met"] = (primary["median_abs_pct"] <= TARGET["median_abs_pct"]
                            and primary["p90_abs_pct"] <= TARGET["p90_abs_pct"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"target (median <= {TARGET['median_abs_pct']}%, p90 <= {TARGET['p90_abs_pct']}%, per operator, "
          f"leave-model-out): {'met' if result['target_met'] else 'NOT met'} -> {args.out}")


if __name__ == "__main__":
    main()
