"""Ramp fidelity: a rate ramp (``arrival.ramp_up_strategy``, loadgen/workload/ramp.py) sent through the HTTP
dispatcher (loadgen.openai_client.openloop) against the tests' fake SSE server with a fixed per-request latency.
The ramp's span is cut into ``--windows`` windows of equal time; per window, the requests actually sent in it over
the ramp's expected count there (Lambda(t1) - Lambda(t0)). Constant arrivals put every send where the ramp puts
it, so the ratio measures the dispatcher; Poisson arrivals add the process's own noise (a window of k expected
requests spreads by about 1 / sqrt(k)), shown beside it. Fresh process per trial (the fake server too), a seed per trial.

    python -m benchmarks.ramp_fidelity [--strategy linear] [--start-qps 5] [--end-qps 50] [--requests 800]
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
import numpy as np
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.workload.ramp import RampUp
from stallfree.loadgen.workload.request_specs import build_workload
from tests.helpers.fakes.fake_sse_server import running_fake_server

kind, strategy, start, end, n, windows, latency_ms, seed = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:5]), \\
    *map(int, sys.argv[5:7]), float(sys.argv[7]), int(sys.argv[8])
arrival = {"kind": kind, "qps": 1.0, "ramp_up_strategy": strategy, "ramp_up_start_qps": start, "ramp_up_end_qps": end}
specs = build_workload(arrival, {"kind": "fixed", "prompt": 8, "output": 1}, n, seed, 1000)
with running_fake_server(ttft_ms=latency_ms, tbt_ms=1.0) as url:
    records = run_open_loop_sync(url, specs, model="fake", timeout_s=60)
start_wall = min(r.intended_send_time - s.send_offset_s for r, s in zip(records, specs, strict=True))
sent = np.array(sorted(r.send_time - start_wall for r in records if r.send_time is not None))
ramp = RampUp(strategy, start, end)
edges = np.linspace(0.0, ramp.span_s(n), windows + 1)
expected = np.diff(ramp.expected_count(edges, n))
actual = np.histogram(sent, bins=edges)[0]
print(json.dumps({"sent": int(len(sent)), "expected_per_window": expected.tolist(), "sent_per_window": actual.tolist(),
                  "ratio_per_window": (actual / expected).tolist(),
                  "late_ms_p99": float(np.percentile([(r.send_time - r.intended_send_time) * 1e3 for r in records
                                                      if r.send_time is not None], 99))}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="linear", choices=["linear", "exponential"])
    ap.add_argument("--start-qps", type=float, default=5.0)
    ap.add_argument("--end-qps", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ramp_fidelity.json")
    args = ap.parse_args()
    result: dict = {**vars(args), "trials": {}}
    for trial in range(args.trials):
        for kind in ("constant", "poisson"):
            done = subprocess.run([sys.executable, "-c", TRIAL, kind, args.strategy, str(args.start_qps),
                                   str(args.end_qps), str(args.requests), str(args.windows), str(args.latency_ms), str(trial)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"trial {trial} ({kind}) failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            result["trials"].setdefault(kind, []).append(row)
            worst = max(abs(r - 1) for r in row["ratio_per_window"])
            print(f"trial {trial} {kind}: worst window {worst:.3f} off the ramp, late p99 {row['late_ms_p99']:.1f} ms",
                  flush=True)
    for kind, rows in result["trials"].items():
        worst = [max(abs(r - 1) for r in row["ratio_per_window"]) for row in rows]
        result[f"{kind}_worst_window_error"] = {"median": statistics.median(worst), "max": max(worst)}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
