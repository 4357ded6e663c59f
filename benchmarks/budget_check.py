"""The token budget, served: ``stallfree-budget``'s chunk size for a TBT SLO, served by sarathi with that
chunk at a moderate Poisson load, against the SLO's bound on the P99 token gap. Two SLOs.

The phases study (``stallfree-bench +experiment=phases``) runs first unless ``--phases`` names a phases.csv
or its directory. The SLOs are given (``--slos 32,64``, in ms), or by default the tightest whole-ms SLOs
that recommend the two smallest measured hybrid chunk sizes (each chunk's predicted P99 x (1 + margin)):
at those the margin is all the room the chunk has, so they test it hardest.

``--simulated COST_MODEL`` runs the study and the served runs on the simulated runner in virtual time
(``model.runner=simulated model.clock=virtual``): iterations drawn from a committed cost model's profile of
a real machine (its fit and its measured spread), not disturbed by this machine's load. It checks the rule
against that machine's iteration times; it does not see what a served run adds (the server, the load
generator's CPU), which only a real run measures.

    python -m benchmarks.budget_check [--phases DIR] [--slos 32,64] [--qps 1] [--num-requests 48]
        [--simulated engine/simulator/fitting/cost_models/small-cpu.json] [--out PATH]
    # writes benchmarks/results/budget_check.json; the runs go to --results-dir (cached: a re-run resumes)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from stallfree.analysis.phases import (
    DEFAULT_MARGIN,
    DEFAULT_TILE,
    default_decode_batch,
    find_phases,
    hybrid_tail_ms,
    load_phases,
    title,
    token_budget,
)


def bench(args: argparse.Namespace, *overrides: str) -> None:
    simulated = (["model.runner=simulated", "model.clock=virtual", f"model.cost_model={Path(args.simulated).resolve()}"]
                 if args.simulated else [])
    cmd = [str(Path(sys.executable).with_name("stallfree-bench")), f"model={args.model}",
           f"results_dir={args.results_dir}", *simulated, *overrides]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def default_slos(frame, decode_batch: int, margin: float) -> list[float]:
    tail = hybrid_tail_ms(frame, decode_batch)
    return [float(math.ceil(tail[size] * (1 + margin))) for size in sorted(tail.index)[:2]]


def served(args: argparse.Namespace, slo_ms: float, chunk: int) -> dict:
    """One run of sarathi at ``chunk`` and ``args.qps`` (an experiment of its own); its summary."""
    experiment = f"budget-{slo_ms:g}ms-{args.qps:g}qps"
    bench(args, f"experiment_name={experiment}", "scheduler=sarathi", f"scheduler.chunk_size={chunk}", f"qps={args.qps}",
          f"slo.tbt_ms={slo_ms}", f"num_requests={args.num_requests}", f"seed={args.seed}")
    summaries = sorted((Path(args.results_dir) / experiment).glob("*/summary.json"), key=os.path.getmtime)
    return json.loads(summaries[-1].read_text())


def check(args: argparse.Namespace, frame, slo_ms: float) -> dict:
    found = token_budget(frame, slo_ms, args.tile, args.decode_batch, args.margin)
    row = {"slo_tbt_ms": slo_ms, "margin": args.margin, "decode_batch": args.decode_batch}
    if found is None:
        tail = hybrid_tail_ms(frame, args.decode_batch)
        print(f"{slo_ms:g} ms: no chunk size fits (the smallest, {tail.index[0]}, predicts {tail.iloc[0]:.1f} ms)",
              flush=True)
        return row | {"chunk_size": None, "smallest_chunk": int(tail.index[0]),
                      "smallest_chunk_predicted_p99_ms": round(float(tail.iloc[0]), 2)}
    load_before = os.getloadavg()[0]
    summary = served(args, slo_ms, found.chunk_size)
    p99 = summary["p99_tbt_ms"]
    row |= {"chunk_size": found.chunk_size, "predicted_p99_iteration_ms": round(found.predicted_ms, 2),
            "limit_ms": round(found.limit_ms, 2), "qps": args.qps, "num_requests": args.num_requests,
            "served_p99_tbt_ms": round(p99, 2), "served_median_tbt_ms": round(summary["median_tbt_ms"], 2),
            "served_p99_over_predicted": round(p99 / found.predicted_ms, 3), "meets_slo": p99 <= slo_ms,
            "disturbed": bool(summary.get("disturbed")), "engine_cpu_share": summary.get("engine_cpu_share"),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(f"{slo_ms:g} ms: chunk_size={found.chunk_size} (predicted P99 iteration {found.predicted_ms:.1f} ms, "
          f"limit {found.limit_ms:.1f} ms): served P99 TBT {p99:.1f} ms at {args.qps:g} QPS -> "
          f"{'meets' if row['meets_slo'] else 'MISSES'} the SLO", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--phases", help="a phases.csv or its directory (default: run the phases study first)")
    ap.add_argument("--slos", help="TBT SLOs in ms, comma-separated (default: the tightest for the two smallest chunks)")
    ap.add_argument("--tile", type=int, default=DEFAULT_TILE)
    ap.add_argument("--decode-batch", type=int, default=None, help="stallfree-budget's --decode-batch")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    ap.add_argument("--qps", type=float, default=1.0)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simulated", metavar="COST_MODEL", help="run on the simulated runner with this cost model")
    ap.add_argument("--results-dir", default="results/budget_check")
    ap.add_argument("--out", default="benchmarks/results/budget_check.json")
    args = ap.parse_args()
    if args.phases is None and find_phases(args.results_dir) is None:
        bench(args, "+experiment=phases")
    frame = load_phases(args.phases or args.results_dir)
    args.decode_batch = args.decode_batch or default_decode_batch()
    slos = [float(s) for s in args.slos.split(",")] if args.slos else default_slos(frame, args.decode_batch, args.margin)
    rows = [check(args, frame, slo) for slo in slos]
    result = {"model": args.model, "machine": title(frame), "phases": str(args.phases or args.results_dir),
              "runner": f"simulated ({args.simulated}), virtual clock" if args.simulated else "model (real)",
              "note": "virtual time: this machine's load does not enter" if args.simulated else
                      "a shared machine: other processes only lengthen iterations (see load_average_1min, "
                      "engine_cpu_share, disturbed)", "checks": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
