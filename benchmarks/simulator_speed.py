"""Simulator speed: one capacity-search probe of a simulated model, as ``stallfree-bench`` runs it, timed in parts.

A probe is a Poisson replay of ``--num-requests`` requests through an in-process ``LLMEngine`` on a
virtual clock (the real schedulers and KV accounting), then its summary and its run directory (parquet).
Reported: simulated iterations/s and requests/s of the replay alone (wall time, and iterations per second of
the process's CPU time, which other jobs on a shared machine disturb less), and the probe's wall time with
its engine start-up, summary and files. ``--label`` names the code revision measured (e.g. before / after a
change), and each label's entry in ``--out`` is replaced, so one file holds the before and after figures.

    python -m benchmarks.simulator_speed --label after [--model mistral7b_sim] [--num-requests 2048]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import subprocess
import tempfile
import time
from pathlib import Path

from stallfree.engine import LLMEngine
from stallfree.engine.hydra_config import compose, engine_of
from stallfree.engine.records.request_metrics import summarize
from stallfree.engine.records.run_summary import RunSummary
from stallfree.loadgen.results.run_dir import requests_frame, write_run
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload


def probe(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    cfg = compose("bench", [f"model={args.model}", f"scheduler={args.scheduler}", f"workload={args.workload}",
                            "workload.lengths.scale=1", f"workload.max_total_tokens={args.max_total_tokens}",
                            f"scheduler.chunk_size={args.chunk_size}"],
                  "simulator_speed")
    engine = LLMEngine.from_config(engine_of(cfg))
    specs = build_workload({"kind": "poisson", "qps": args.qps}, cfg["workload"]["lengths"], args.num_requests,
                           0, engine.vocab_size, args.max_total_tokens)
    built, cpu_start = time.perf_counter(), time.process_time()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    result = replay(engine, specs, pause_gc=True)  # as stallfree-bench replays on a virtual clock
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    replayed, replay_cpu_s = time.perf_counter(), time.process_time() - cpu_start
    summary = summarize(requests_frame(result.records))
    with tempfile.TemporaryDirectory() as tmp:
        write_run(tmp, "probe", config={}, requests=result.records, summary=RunSummary.from_flat(summary),
                  batches=result.batches)
    done = time.perf_counter()
    replay_s = replayed - built
    return {"iterations": len(result.batches), "requests": len(specs), "completed": summary["completed"],
            "simulated_s": result.batches[-1].end_time - result.batches[0].start_time,
            "startup_s": round(built - started, 3), "replay_s": round(replay_s, 3),
            "replay_cpu_s": round(replay_cpu_s, 3),
            "summary_and_files_s": round(done - replayed, 3), "probe_s": round(done - started, 3),
            "iterations_per_s": round(len(result.batches) / replay_s, 1),
            "requests_per_s": round(len(specs) / replay_s, 1),
            "iterations_per_cpu_s": round(len(result.batches) / replay_cpu_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="what revision this is (before / after ...)")
    ap.add_argument("--model", default="mistral7b_sim", help="a conf/model preset with runner: simulated")
    ap.add_argument("--scheduler", default="sarathi")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--workload", default="arxiv")
    ap.add_argument("--qps", type=float, default=4.0)
    ap.add_argument("--num-requests", type=int, default=2048)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3, help="probes; the fastest is reported, all are kept")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile entries of one replay")
    ap.add_argument("--out", default="benchmarks/results/simulator_speed.json")
    args = ap.parse_args()
    runs = [probe(args) for _ in range(args.repeats)]
    best = min(runs, key=lambda r: r["replay_cpu_s"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    entry = {"commit": commit, "machine": f"{platform.machine()}, shared with other jobs (timings are noisy)",
             "setup": {k: v for k, v in vars(args).items() if k not in ("label", "out", "profile")},
             "best": best, "runs": runs}
    print(json.dumps({args.label: entry}, indent=2))
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    results[args.label] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
