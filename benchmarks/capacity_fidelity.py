"""Simulated vs real capacity: the same capacity searches (``stallfree-bench +experiment=capacity``) on the
real engine and on ``model.runner=simulated model.clock=virtual`` with a committed cost model, and the
error of each simulated capacity.

The simulated searches take the SLO's TBT bound in milliseconds from the real ones, so that the two
differ only in the iterations' times, not in the decode probe that a relative SLO is scaled from.

    python -m benchmarks.capacity_fidelity [--model small] [--cost-model engine/simulator/fitting/cost_models/small-cpu.json]
    # writes benchmarks/results/capacity_fidelity.json; the runs go to --results-dir (cached: a re-run resumes)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def capacity_search(args: argparse.Namespace, runner: str, policy: str, chunk_size: int,
                    extra: list[str]) -> dict:
    """One ``stallfree-bench`` capacity search, in an experiment of its own; its record of capacity.json
    (whose chunk_size is null for policies that do not chunk)."""
    bench = Path(sys.executable).with_name("stallfree-bench")
    experiment = f"{runner}-{policy}-{chunk_size}"
    cmd = [str(bench), "+experiment=capacity", f"experiment_name={experiment}", f"results_dir={args.results_dir}",
           f"model={args.model}", f"scheduler={policy}", f"scheduler.chunk_size={chunk_size}", f"slo={args.slo}",
           f"num_requests={args.num_requests}", f"repeats={args.repeats}", *extra]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    records = json.loads((Path(args.results_dir) / experiment / "capacity.json").read_text())
    return next(r for r in records if r["slo_name"] == args.slo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--cost-model", default="engine/simulator/fitting/cost_models/small-cpu.json")
    ap.add_argument("--policies", default="vllm:512,sarathi:128", help="SCHEDULER:CHUNK_SIZE, comma-separated")
    ap.add_argument("--slo", default="relaxed")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="searches per policy, seeds seed, seed + 1, ...")
    ap.add_argument("--results-dir", default="results/capacity_fidelity")
    ap.add_argument("--out", default="benchmarks/results/capacity_fidelity.json")
    args = ap.parse_args()
    simulated = ["model.runner=simulated", "model.clock=virtual", f"model.cost_model={Path(args.cost_model).resolve()}"]
    rows = []
    for policy, chunk in (p.split(":") for p in args.policies.split(",")):
        real = capacity_search(args, "real", policy, int(chunk), [])
        sim = capacity_search(args, "simulated", policy, int(chunk), [*simulated, f"slo.tbt_ms={real['slo_tbt_ms']}"])
        error = (sim["capacity_qps"] / real["capacity_qps"] - 1) * 100 if real["capacity_qps"] else None
        rows.append({"policy": f"{policy}-{chunk}", "slo": args.slo, "slo_tbt_ms": real["slo_tbt_ms"],
                     "real": real, "simulated": sim, "error_pct": error})
        print(f"{policy}-{chunk} slo={args.slo} ({real['slo_tbt_ms']:.0f} ms): real {real['capacity_qps']:g} qps "
              f"[{real['lo_qps']}, {real['hi_qps']}], simulated {sim['capacity_qps']:g} qps "
              f"[{sim['lo_qps']}, {sim['hi_qps']}]" + (f" ({error:+.1f}%)" if error is not None else ""), flush=True)
    result = {"model": args.model, "cost_model": args.cost_model, "num_requests": args.num_requests,
              "repeats": args.repeats, "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
