"""``stallfree-tune`` against the exhaustive live grid it stands in for: the same settings, workload and SLO,
each setting's capacity searched live (one ``stallfree-capacity`` a setting, as a user sweeping by hand would),
and the tune's wall time against the grid's.

The grid's searches take the tune's SLO (its decode reference pinned: ``slo.reference_ms``), so that both judge
every setting against one bound. They run in a results directory of their own: no run is shared with the tune.

    python -m benchmarks.tune_vs_grid [--model small] [--slos relaxed strict]
    # writes benchmarks/results/tune_vs_grid.json; the runs go to --results-dir (cached: a re-run resumes)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def timed(cmd: list[str]) -> tuple[float, int]:
    """The command's wall time and how many runs it measured (not read back from the cache: a resumed
    benchmark's times are not the searches' own)."""
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return time.monotonic() - start, done.stdout.count("[done]")


def grid_search(args: argparse.Namespace, slo: str, reference_ms: float | None, row: dict) -> dict:
    """One live capacity search of a tune's setting, in an experiment of its own; its capacity and wall time."""
    experiment = f"grid-{slo}-{row['policy']}-{row['chunk_size']}-{row['max_num_seqs']}"
    pinned = [] if reference_ms is None else [f"slo.reference_ms={reference_ms}"]
    chunk = [] if row["chunk_size"] is None else [f"scheduler.chunk_size={row['chunk_size']}"]
    cmd = [str(BIN / "stallfree-capacity"), *args.common, f"slo={slo}", *pinned, f"experiment_name={experiment}",
           f"results_dir={args.results_dir}", "hydra.mode=RUN", f"scheduler={row['policy']}", *chunk,
           f"scheduler.max_num_seqs={row['max_num_seqs']}"]
    seconds, measured = timed(cmd)
    [record] = json.loads((Path(args.results_dir) / experiment / "capacity.json").read_text())
    return {**{k: record[k] for k in ("capacity_qps", "capacity_bound", "capacity_display")}, "wall_s": seconds,
            "runs_measured": measured}


def one_slo(args: argparse.Namespace, slo: str) -> dict:
    tune_s, tune_runs = timed([str(BIN / "stallfree-tune"), *args.common, *args.grid, f"slo={slo}", f"experiment_name=tune-{slo}",
                    f"results_dir={args.results_dir}"])
    tune = json.loads((Path(args.results_dir) / f"tune-{slo}" / "tune.json").read_text())
    reference = tune["slo"]["decode_iter_ms"] if tune["slo"]["slo_reference_method"] != "absolute" else None
    grid = {row["label"]: grid_search(args, slo, reference, row) for row in tune["settings"]}
    grid_s = sum(g["wall_s"] for g in grid.values())
    best_label = max(grid, key=lambda label: grid[label]["capacity_qps"])
    recommended = next((r for r in tune["settings"] if r["label"] == tune["recommendation"]), None)
    tuned_qps = recommended["measured_capacity_qps"] if recommended else None
    best_qps = grid[best_label]["capacity_qps"]
    result = {"slo": slo, "slo_tbt_ms": tune["slo"]["slo_tbt_ms"], "answer": tune["answer"],
              "tune_wall_s": tune_s, "tune_runs_measured": tune_runs, "grid_wall_s": grid_s, "wall_ratio": tune_s / grid_s,
              "recommended": tune["recommendation"], "recommended_measured_qps": tuned_qps,
              "recommended_grid_qps": grid.get(tune["recommendation"], {}).get("capacity_qps"),
              "grid_best": best_label, "grid_best_qps": best_qps,
              "tuned_over_grid_best": tuned_qps / best_qps if tuned_qps and best_qps else None,
              "disagreements": tune["disagreements"], "tune_settings": tune["settings"], "grid": grid}
    print(f"slo={slo}: tune {tune_s:.0f} s ({tune['recommendation']}: {tuned_qps} qps), grid {grid_s:.0f} s "
          f"(best {best_label}: {best_qps} qps): wall {result['wall_ratio']:.2f}x, capacity "
          f"{result['tuned_over_grid_best']}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--slos", nargs="+", default=["relaxed", "strict"])
    ap.add_argument("--chunk-sizes", default="128,256,512,1024")
    ap.add_argument("--max-num-seqs", default="8,32,128")
    ap.add_argument("--results-dir", default="results/tune_vs_grid")
    ap.add_argument("--out", default="benchmarks/results/tune_vs_grid.json")
    args = ap.parse_args()
    args.common = [f"model={args.model}", "workload=arxiv", "num_requests=16", "capacity.min_duration_s=10",
                   "capacity.start_qps=4", "capacity.tolerance=0.2"]
    args.grid = [f"tune.chunk_sizes=[{args.chunk_sizes}]", f"tune.max_num_seqs=[{args.max_num_seqs}]"]
    results = {"model": args.model, "common_args": args.common, "grid_args": args.grid, "slos": []}
    for slo in args.slos:
        results["slos"].append(one_slo(args, slo))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
