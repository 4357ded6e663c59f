"""One engine's capacity through every target: the same capacity search (``stallfree-bench
+experiment=capacity``, one policy, one SLO) of stallfree-serve's engine in process (target=inprocess), over
HTTP with a server the search starts (target=http), and on a server started here (target=url), the url
search run twice. Each search is an experiment of its own (nothing cached between them), judged by one SLO
bound taken from the committed cost model, so that the targets differ only in how requests reach the engine.

Checks: every capacity within --within (0.2) of the inprocess one, and the two url searches within the
search's tolerance (capacity.tolerance) of each other.

    python -m benchmarks.capacity_agreement [--model small] [--policy sarathi:256] [--slo relaxed] [OVERRIDES]
    # writes benchmarks/results/capacity_agreement.json; the runs go to --results-dir
    # OVERRIDES default to a short fixed workload: 128-token prompts, 64 tokens out, capacity.tolerance=0.25
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from stallfree.loadgen.targets.server_process import ServerProcess, free_port

DEFAULT_OVERRIDES = ["workload=fixed", "workload.lengths.prompt=128", "workload.lengths.output=64",
                     "capacity.tolerance=0.25"]


def capacity_search(args: argparse.Namespace, name: str, target: list[str]) -> dict:
    """One capacity search in the experiment ``name``: its capacity.json record for --slo."""
    policy, chunk_size = args.policy.split(":")
    bench = Path(sys.executable).with_name("stallfree-bench")
    cmd = [str(bench), "+experiment=capacity", f"experiment_name={name}", f"results_dir={args.results_dir}",
           f"model={args.model}", f"scheduler={policy}", f"scheduler.chunk_size={chunk_size}", f"slo={args.slo}",
           f"slo.reference_cost_model={args.cost_model}", f"num_requests={args.num_requests}", *target,
           *args.overrides]
    print("$ " + " ".join(cmd), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True)
    return {"wall_s": round(time.monotonic() - started, 1), **search_record(args.results_dir, name, args.slo)}


def search_record(results_dir: str, name: str, slo: str) -> dict:
    """The capacity.json record of the search in experiment ``name`` for ``slo``."""
    records = json.loads((Path(results_dir) / name / "capacity.json").read_text())
    return next(r for r in records if r["slo_name"] == slo)


def summarise(searches: dict[str, dict], within: float) -> dict:
    """The capacities, their ratios to the inprocess one and to each other, and the two checks."""
    capacity = {name: s["capacity_qps"] for name, s in searches.items()}
    base = capacity["inprocess"]
    ratios = {name: round(c / base, 3) if base else None for name, c in capacity.items()}
    tolerance = searches["url"]["capacity"]["tolerance"]
    first, second = capacity["url"], capacity["url_repeat"]
    repeat_gap = abs(first - second) / max(first, second) if max(first, second) else 0.0
    return {
        "capacity_qps": capacity,
        "bounds": {name: s["capacity_display"] for name, s in searches.items()},
        "ratio_to_inprocess": ratios,
        "targets_agree": all(r is not None and abs(r - 1) <= within for r in ratios.values()),
        "repeat_gap": round(repeat_gap, 3),
        "repeat_tolerance": tolerance,
        "repeats_agree": repeat_gap <= tolerance,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--policy", default="sarathi:256", help="SCHEDULER:CHUNK_SIZE")
    ap.add_argument("--slo", default="relaxed")
    ap.add_argument("--cost-model", default="small-cpu.json", help="the SLO's decode reference")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--within", type=float, default=0.2, help="the targets' capacities agree within this")
    ap.add_argument("--results-dir", default="results/capacity_agreement")
    ap.add_argument("--out", default="benchmarks/results/capacity_agreement.json")
    ap.add_argument("overrides", nargs="*", help="more stallfree-bench overrides for every search "
                    f"(default: {' '.join(DEFAULT_OVERRIDES)})")
    args = ap.parse_args()
    args.overrides = args.overrides or DEFAULT_OVERRIDES
    policy, chunk_size = args.policy.split(":")
    searches: dict[str, dict] = {}
    searches["inprocess"] = capacity_search(args, "inprocess", ["target=inprocess"])
    searches["http"] = capacity_search(args, "http", ["target=http"])
    with contextlib.ExitStack() as stack:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = [str(Path(sys.executable).with_name("stallfree-serve")), f"model={args.model}",
                 f"scheduler={policy}", f"scheduler.chunk_size={chunk_size}", f"port={port}"]
        stack.enter_context(ServerProcess(serve, url, Path(args.results_dir) / "stallfree-serve.log"))
        for name in ("url", "url_repeat"):
            searches[name] = capacity_search(args, name, ["target=url", f"target.url={url}"])
    result = {"model": args.model, "policy": args.policy, "slo": args.slo, "cost_model": args.cost_model,
              "num_requests": args.num_requests, "within": args.within, "overrides": args.overrides,
              **summarise(searches, args.within), "searches": searches}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[capacity_agreement] {result['bounds']}; ratios to inprocess {result['ratio_to_inprocess']} "
          f"(agree within {args.within:g}: {result['targets_agree']}); url repeat gap {result['repeat_gap']} "
          f"(<= tolerance {result['repeat_tolerance']}: {result['repeats_agree']})", flush=True)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
