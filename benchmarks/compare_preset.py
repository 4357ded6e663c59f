"""The compare preset end to end, timed: ``stallfree-bench +experiment=compare`` (stallfree-serve with the vllm
and the sarathi policy, and the server at compare.vllm_url; compare.qps points each plus a capacity search),
then ``stallfree-report`` on its results. Records the wall time of each step and every contender's capacity.

    peers/vllm_cpu.sh serve ~/.cache/stallfree/small-v1 8300 --dtype DTYPE --no-enable-prefix-caching &  # our model.dtype
    python -m benchmarks.compare_preset [--budget-min 15] [stallfree-bench overrides ...]
    # writes benchmarks/results/compare_preset.json; the runs go to --results-dir (fresh: no cache)
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from stallfree.engine.records.machine import cpu_description


def timed(cmd: list[str]) -> float:
    print("$ " + " ".join(cmd), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True)
    return round(time.monotonic() - started, 1)


def record(results: Path, bench_s: float, report_s: float, budget_s: float) -> dict:
    """The wall times against the budget, the machine, and every contender's capacity and points."""
    contenders = json.loads((results / "compare" / "compare.json").read_text())
    total_s = bench_s + report_s
    measured = next((c for c in contenders if c["status"] == "measured"), {})
    return {
        "machine": cpu_description(), "bench_wall_s": bench_s, "report_wall_s": report_s, "total_wall_s": total_s,
        "budget_s": budget_s, "within_budget": total_s <= budget_s,
        "slo_reference": {k: measured.get(k) for k in ("slo_reference_method", "decode_iter_ms",
                                                       "slo_reference_measured_on", "slo_reference_disturbed")},
        "contenders": [{"contender": c["contender"], "status": c["status"], "label": c.get("scheduler"),
                        "capacity": c.get("capacity_display"), "slo_tbt_ms": c.get("slo_tbt_ms"),
                        "disturbed_points": c.get("disturbed_points"), "reason": c.get("reason"),
                        "points": [{k: p[k] for k in ("qps", "passed", "p99_tbt_ms", "failed_rules")}
                                   for p in c.get("points", [])]} for c in contenders],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-dir", default="results/compare_preset")
    ap.add_argument("--budget-min", type=float, default=15.0, help="the preset's time budget (minutes)")
    ap.add_argument("--out", default="benchmarks/results/compare_preset.json")
    ap.add_argument("overrides", nargs="*", help="stallfree-bench overrides")
    args = ap.parse_args()
    results = Path(args.results_dir)
    shutil.rmtree(results, ignore_errors=True)
    bin_dir = Path(sys.executable).parent
    bench_s = timed([str(bin_dir / "stallfree-bench"), "+experiment=compare", f"results_dir={results}",
                     *args.overrides])
    report_s = timed([str(bin_dir / "stallfree-report"), str(results / "compare")])
    result = {"overrides": args.overrides, **record(results, bench_s, report_s, args.budget_min * 60)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[compare_preset] {result['total_wall_s'] / 60:.1f} min (budget {args.budget_min:g}): "
          + "; ".join(f"{c['contender']} {c['status']} {c['capacity']}" for c in result["contenders"]), flush=True)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
