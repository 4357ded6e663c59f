"""What the sampled operator split costs (model.op_split_every, engine/utilization/op_split.py), measured so
that a loaded machine hurts it least: one engine with the split on every other iteration runs each shape
(decode-only batches of 1 and 32 at context 256, a 512-token prefill-only iteration) many times in a row, so
sampled and unsampled iterations of the same shape interleave. Per shape:

* ``overhead``: the fastest sampled iteration over the fastest unsampled one, minus 1 (what the hooks add to
  a sampled iteration; a run sampling every Nth iteration is slowed by about overhead / N);
* ``sampled_over_unsampled``: the median sampled iteration's time (= linear + attention + other, by
  construction) over the median unsampled one (target: within 5%).

    python -m benchmarks.op_split_overhead [--model small] [--repeats 20] [--every 16]
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks.engine_throughput import write_result
from stallfree.engine import LLMEngine
from stallfree.loadgen.studies.driver import IterationDriver


def compare(records: list) -> dict:
    sampled = [r.end_time - r.start_time for r in records if r.linear_s is not None]
    plain = [r.end_time - r.start_time for r in records if r.linear_s is None]
    split = [(r.linear_s + r.attention_s + r.other_s) / (r.end_time - r.start_time) for r in records
             if r.linear_s is not None]
    return {"sampled": len(sampled), "unsampled": len(plain), "overhead": min(sampled) / min(plain) - 1,
            "sampled_over_unsampled": statistics.median(sampled) / statistics.median(plain),
            "split_sum_over_iteration": statistics.median(split),
            "linear_share": statistics.median(r.linear_s / (r.end_time - r.start_time) for r in records
                                              if r.linear_s is not None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--every", type=int, default=16, help="the sampling interval the run-level figure is for")
    ap.add_argument("--out", default="benchmarks/results/op_split_overhead.json")
    args = ap.parse_args()
    engine = LLMEngine.from_kwargs(model=args.model, op_split_every=2)
    driver = IterationDriver(engine, warmup=2, repeats=args.repeats)
    shapes = {f"decode_b{b}": records for b, records in driver.decode_batches([1, 32], context=256).items()}
    shapes["prefill_512"] = driver.prefill(512)
    result: dict = {"model": args.model, "repeats": args.repeats, "every": args.every}
    for name, records in shapes.items():
        result[name] = compare(records)
        result[name][f"run_slowdown_every_{args.every}"] = result[name]["overhead"] / args.every
    result["note"] = "measured on a shared machine: other processes load the CPU (fastest-of and medians)"
    write_result(result, args.out)


if __name__ == "__main__":
    main()
