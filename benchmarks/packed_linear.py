"""CPU linears: PyTorch's ``F.linear`` vs oneDNN with the weight reordered once (``PackedLinear``), on one
model's projections (qkv, o, gate_up, down, lm_head), at the row counts of decode steps and prefill chunks.
Each figure is the best of 5 timings of ``--calls`` calls, in ms for all five projections together.

    python -m benchmarks.packed_linear [--model small] [--dtype bfloat16] [--out benchmarks/results/packed_linear.json]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from benchmarks.engine_throughput import write_result
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.packed_linear import PackedLinear, can_pack
from stallfree.engine.model.presets import resolve_model_path


def best_ms(fn, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def projections(arch: ArchConfig) -> dict[str, tuple[int, int]]:
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return {"qkv": (arch.hidden_size, q + 2 * kv), "o": (q, arch.hidden_size),
            "gate_up": (arch.hidden_size, 2 * arch.intermediate_size), "down": (arch.intermediate_size, arch.hidden_size),
            "lm_head": (arch.hidden_size, arch.vocab_size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,8,32,128,512")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/packed_linear.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if not can_pack(torch.device("cpu"), dtype):
        raise SystemExit(f"this CPU does not pack {args.dtype} linears (no oneDNN, or no native bf16)")
    torch.manual_seed(0)
    shapes = projections(ArchConfig.from_dir(resolve_model_path(args.model)))
    layers = {name: nn.Linear(k, n, bias=False, dtype=dtype) for name, (k, n) in shapes.items()}
    packed = {name: PackedLinear(linear) for name, linear in layers.items()}
    result: dict = {"model": args.model, "dtype": args.dtype, "threads": torch.get_num_threads()}
    with torch.inference_mode():
        for rows in map(int, args.rows.split(",")):
            plain_ms = packed_ms = 0.0
            for name, (k, _) in shapes.items():
                x = torch.randn(rows, k, dtype=dtype)
                plain_ms += best_ms(lambda lin=layers[name], x=x: lin(x), args.calls)
                packed_ms += best_ms(lambda lin=packed[name], x=x: lin(x), args.calls)
            result[f"rows{rows}_plain_ms"], result[f"rows{rows}_packed_ms"] = plain_ms, packed_ms
            result[f"rows{rows}_speedup"] = plain_ms / packed_ms
    write_result(result, args.out)


if __name__ == "__main__":
    main()
