"""Closed-loop fidelity: ``arrival=concurrent`` (every request due at once, at most N in flight) through the HTTP
dispatcher (loadgen.openai_client.openloop) against the tests' fake SSE server with a fixed per-request latency L
(one token, streamed L after the request arrives). A closed loop of N clients gives N / L requests per second;
per N and trial: the achieved request throughput over N / L, the peak in flight, and the median client wait.
Fresh process per trial (the fake server too), N in turn. The tests assert the behaviour with wide bounds.

    python -m benchmarks.closed_loop [--latency-ms 250] [--waves 8] [--trials 3] [--out benchmarks/results/closed_loop.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from benchmarks.engine_throughput import write_result

TRIAL = """
import json, sys
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.engine.records.request_metrics import summarize
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.workload.request_specs import build_workload
from tests.helpers.fakes.fake_sse_server import running_fake_server

n, latency_ms, waves = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 8, "output": 1}, n * waves, 0, 1000)
with running_fake_server(ttft_ms=latency_ms, tbt_ms=1.0) as url:
    s = summarize(requests_frame(run_open_loop_sync(url, specs, model="fake", timeout_s=60, max_in_flight=n)))
print(json.dumps({k: s[k] for k in ("completed", "request_throughput", "peak_in_flight", "client_wait_p50_ms",
                                    "client_fell_behind")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--latency-ms", type=float, default=250.0)
    ap.add_argument("--waves", type=int, default=8, help="requests per client")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/closed_loop.json")
    args = ap.parse_args()
    result: dict = {**vars(args), "trials_by_concurrency": {}}
    for trial in range(args.trials):
        for n in args.concurrency:
            done = subprocess.run([sys.executable, "-c", TRIAL, str(n), str(args.latency_ms), str(args.waves)],
                                  capture_output=True, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["throughput_over_n_per_latency"] = row["request_throughput"] / (n / (args.latency_ms / 1e3))
            result["trials_by_concurrency"].setdefault(str(n), []).append(row)
            print(n, trial, row, flush=True)
    result["median_ratio"] = {n: statistics.median(r["throughput_over_n_per_latency"] for r in rows)
                              for n, rows in result["trials_by_concurrency"].items()}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
