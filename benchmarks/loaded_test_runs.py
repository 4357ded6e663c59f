"""The test suite on a busy machine: ``make test`` (the README's test command) N times in a row while a
burner keeps one core busy. Each run's wall time, exit code and pytest's summary line go to a JSON file.

    python -m benchmarks.loaded_test_runs [--runs 3] [--duty 1.0] [--out benchmarks/results/loaded_test_runs.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from benchmarks.lib.burner import Burner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duty", type=float, default=1.0, help="the burner's share of one core")
    ap.add_argument("--command", default="make test")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/loaded_test_runs.json"))
    args = ap.parse_args()
    runs = []
    with Burner(args.duty):
        for i in range(args.runs):
            start = time.monotonic()
            proc = subprocess.run(args.command, shell=True, capture_output=True, text=True)
            wall = time.monotonic() - start
            summary = next((line for line in reversed(proc.stdout.splitlines()) if " in " in line), "")
            runs.append({"run": i + 1, "wall_s": round(wall, 1), "returncode": proc.returncode, "summary": summary,
                         "load_avg_at_end": os.getloadavg()})
            print(json.dumps(runs[-1]), flush=True)
            if proc.returncode:
                print(proc.stdout[-5000:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": args.command, "burner_duty": args.duty, "cpus": os.cpu_count(),
                                    "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
