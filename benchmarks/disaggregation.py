"""Disaggregated prefill and decode on this machine against colocated engines: ``parallel.disaggregation=1p1d``
(one core per instance), two data-parallel replicas (``parallel.data_parallel_size=2``, one core each: the
comparison per device) and one process on every core; the same policy, model, workload and Poisson loads, each
run a fresh ``stallfree-bench`` process (``target=inprocess``), the arms in turn, reversed every other round:
TTFT and TBT P50 / P99, output throughput, and the 1P1D runs' KV transfers (bytes and milliseconds per request).

    python -m benchmarks.disaggregation [--model small] [--qps 1,2,4] [--rounds 2] [--num-requests 32] [--dtype auto]
        [--out benchmarks/results/disaggregation_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

BENCH = Path(sys.executable).parent / "stallfree-bench"
ARMS = {"colocated": ["cache.enable_prefix_caching=true"],
        "replicas": ["cache.enable_prefix_caching=true", "parallel.data_parallel_size=2"],
        "1p1d": ["cache.enable_prefix_caching=true", "parallel.disaggregation=1p1d"]}
RATIOS = (("1p1d", "colocated"), ("1p1d", "replicas"), ("replicas", "colocated"))
RATIO_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tbt_ms", "p99_tbt_ms", "output_throughput")
SUMMARY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tbt_ms", "p99_tbt_ms", "output_throughput", "completed",
                "failed")


def add_arm_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings every arm runs with (this benchmark's and benchmarks/disaggregation_capacity.py's)."""
    parser.add_argument("--model", default="small")
    parser.add_argument("--policy", default="sarathi")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--workload", default="arxiv")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-requests", type=int, default=32)


def bench_command(arm: str, experiment: str, args: argparse.Namespace, results_dir: Path) -> list[str]:
    """``stallfree-bench`` with ``arm``'s keys and the shared settings; the caller adds its mode's keys."""
    return [str(BENCH), f"model={args.model}", f"scheduler={args.policy}", f"scheduler.chunk_size={args.chunk_size}",
            f"workload={args.workload}", "arrival=poisson", f"num_requests={args.num_requests}",
            f"model.dtype={args.dtype}", f"results_dir={results_dir}", f"experiment_name={experiment}", *ARMS[arm]]


def run_once(arm: str, qps: float, args: argparse.Namespace, results_dir: Path) -> dict:
    cmd = [*bench_command(arm, f"{arm}-{qps}", args, results_dir), f"qps={qps}"]
    started = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    run_dir = next(results_dir.glob(f"{arm}-{qps}/*/summary.json")).parent
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {key: summary[key] for key in SUMMARY_KEYS} | {"wall_s": time.monotonic() - started}
    requests = pd.read_parquet(run_dir / "requests.parquet")
    if "kv_transfer_bytes" in requests and requests["kv_transfer_bytes"].notna().any():
        moved = requests.dropna(subset=["kv_transfer_bytes"])
        out["median_kv_transfer_bytes"] = float(moved["kv_transfer_bytes"].median())
        out["median_kv_transfer_ms"] = float(1e3 * (moved["kv_transfer_end"] - moved["kv_transfer_start"]).median())
    batches = pd.read_parquet(run_dir / "batches.parquet")
    if "instance" in batches:
        out["iterations_per_instance"] = {str(k): int(v) for k, v in batches["instance"].value_counts().items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arm_arguments(parser)
    parser.add_argument("--qps", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/disaggregation_cpu.json"))
    args = parser.parse_args()
    loads = [float(q) for q in args.qps.split(",")]
    runs: dict[str, dict[str, list[dict]]] = {arm: {str(q): [] for q in loads} for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for qps in loads:
                order = list(ARMS) if round_index % 2 == 0 else list(reversed(ARMS))
                for arm in order:
                    result = run_once(arm, qps, args, Path(tmp) / f"round{round_index}")
                    runs[arm][str(qps)].append(result)
                    print(f"round {round_index} qps {qps} {arm}: " + ", ".join(
                        f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)), flush=True)
    ratios = {f"{a}/{b}": {str(q): {key: [x[key] / y[key] for x, y in zip(runs[a][str(q)], runs[b][str(q)], strict=True)
                                      if y[key]] for key in RATIO_KEYS} for q in loads} for a, b in RATIOS}
    medians = {pair: {q: {key: statistics.median(values) for key, values in by_key.items() if values}
                      for q, by_key in by_qps.items()} for pair, by_qps in ratios.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python -m benchmarks.disaggregation " + " ".join(sys.argv[1:]),
        "settings": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
        "ratios": ratios, "median_ratios": medians}, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
