"""The harness's prefix-reuse workloads on vLLM's CPU build and on stallfree-serve, both caching prefixes, into one
experiment and one report: a Mooncake-format trace replayed at its own times (``workload=mooncake
arrival=trace``), chat sessions and agent sessions (``workload=chat``, ``workload=agentic``), each run through
``stallfree-bench`` as a user runs it. vLLM first (``target=url``, started with ``--enable-prefix-caching
--block-size 32`` and ``VLLM_SERVER_DEV_MODE=1`` so the bench can empty its cache before each run), then
stallfree-serve (``target=http``, the same block size, chunk 512, KV budget and dtype). Per run: every request's
row, the workload's ideal hit rate, the hit rate the harness read from the server's /metrics, and for vLLM the
rate of its own counters read around the whole bench command (the harness's probes included); TTFT of first
turns and follow-ups; output throughput. Then ``stallfree-report`` on the experiment.

    python -m benchmarks.reuse_workloads --peer PATH/TO/vllm_cpu.sh [--model small] [--out ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.engine_throughput import write_result
from benchmarks.vs_vllm_cpu import start_vllm
from benchmarks.vs_vllm_prefix import prefix_counters
from stallfree.engine.device import choose_dtype
from stallfree.engine.model.presets import resolve_model_path

WORKLOADS = {
    "mooncake": ["workload=mooncake", "arrival=trace", "arrival.name=mooncake_conversation", "arrival.time_scale=0.5",
                 "num_requests=200"],
    "chat": ["workload=chat", "arrival=poisson", "qps=0.5", "num_requests=60"],
    "agentic": ["workload=agentic", "arrival=poisson", "qps=0.25", "num_requests=60"],
}
FIELDS = ("completed", "failed", "workload_ideal_hit_rate", "server_prefix_cache_hit_rate", "prefix_cache_reset",
          "prefix_cache_warning", "median_ttft_ms", "median_ttft_first_turn_ms", "median_ttft_follow_up_ms",
          "num_sessions", "sessions_completed", "output_throughput", "engine_label")


def bench(*overrides: str) -> None:
    command = [os.path.join(os.path.dirname(sys.executable), "stallfree-bench"), *overrides]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)


def summary_of(exp_dir: Path, workload: str, label_part: str) -> dict:
    """The summary of the newest run of ``workload`` whose engine label or scheduler names ``label_part``."""
    runs = [json.loads(p.read_text()) | {"mtime": p.stat().st_mtime} for p in exp_dir.glob("*/summary.json")]
    mine = [s for s in runs if s["workload"] == workload and label_part in str(s.get("engine_label") or s["scheduler"])]
    return max(mine, key=lambda s: s["mtime"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="script that serves vLLM's CPU build: PEER serve DIR PORT ...")
    ap.add_argument("--model", default="small")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--kv-gib", type=float, default=4.0)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--experiment", default="reuse_vs_vllm")
    ap.add_argument("--out", default="benchmarks/results/reuse_workloads.json")
    args = ap.parse_args()
    model_dir = resolve_model_path(args.model)
    dtype = choose_dtype("auto", torch.device("cpu")).name
    exp_dir = Path(args.results_dir) / args.experiment
    common = [f"model={args.model}", f"model.dtype={dtype}", f"cache.block_size={args.block_size}", "warmup=0",
              "slo.tbt_ms=1000", f"results_dir={args.results_dir}", f"experiment_name={args.experiment}", "--force"]
    result: dict = {**vars(args), "dtype": dtype, "runs": []}
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache
    log = Path(args.out).with_suffix(".vllm.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    peer = start_vllm(args.peer, model_dir, 8135, 512, dtype, args.kv_gib, log, "--enable-prefix-caching",
                      "--block-size", str(args.block_size))
    url = "http://127.0.0.1:8135"
    try:
        for name in args.workloads:
            queries, hits = prefix_counters(url)
            bench(*common, *WORKLOADS[name], "target=url", f"target.url={url}", "target.token_ids=true")
            queries_after, hits_after = prefix_counters(url)
            summary = summary_of(exp_dir, name, "vllm")
            own = (hits_after - hits) / (queries_after - queries) if queries_after > queries else None
            result["runs"].append({"server": "vllm", "workload": name, "vllm_own_counters_hit_rate": own,
                                   **{k: summary.get(k) for k in FIELDS}})
            print(result["runs"][-1], flush=True)
    finally:
        peer.stop(60)
    for name in args.workloads:
        bench(*common, *WORKLOADS[name], "target=http", "scheduler=sarathi", "scheduler.chunk_size=512",
              "cache.enable_prefix_caching=true", f"cache.kv_memory_gib={args.kv_gib}")
        result["runs"].append({"server": "stallfree", "workload": name,
                               **{k: v for k, v in summary_of(exp_dir, name, "sarathi").items() if k in FIELDS}})
        print(result["runs"][-1], flush=True)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "stallfree-report"), str(exp_dir)], check=True)
    result["report"] = str(exp_dir / "report.html")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
