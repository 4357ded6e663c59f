"""The capacity of 1P1D, of two data-parallel replicas and of one process on every core on this machine, under a
strict and a relaxed P99 TBT SLO (absolute, the same for every arm): one ``stallfree-bench mode=capacity`` search
per arm and SLO, each its own experiment, with the arms and settings of benchmarks/disaggregation.py.

    python -m benchmarks.disaggregation_capacity [--model small] [--strict-ms 50] [--relaxed-ms 250] [--tolerance 0.1]
        [--out benchmarks/results/disaggregation_capacity_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.disaggregation import ARMS, add_arm_arguments, bench_command

CAPACITY_KEYS = ("capacity_qps", "capacity_display", "bracketed", "lo_qps", "hi_qps", "slo_tbt_ms")


def search(arm: str, slo_name: str, tbt_ms: float, args: argparse.Namespace, results_dir: Path) -> dict:
    experiment = f"{arm}-{slo_name}"
    cmd = [*bench_command(arm, experiment, args, results_dir), "mode=capacity", f"slo={slo_name}",
           f"slo.tbt_ms={tbt_ms}", f"capacity.start_qps={args.start_qps}", f"capacity.tolerance={args.tolerance}",
           f"capacity.unsure_remeasures={args.unsure_remeasures}"]
    started = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    record = json.loads((results_dir / experiment / "capacity.json").read_text())[0]
    return {key: record.get(key) for key in CAPACITY_KEYS} | {"minutes": (time.monotonic() - started) / 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arm_arguments(parser)
    parser.add_argument("--start-qps", type=float, default=2.0)
    parser.add_argument("--tolerance", type=float, default=0.1)  # the searches' relative bracket width
    parser.add_argument("--unsure-remeasures", type=int, default=1)
    parser.add_argument("--strict-ms", type=float, default=50.0)
    parser.add_argument("--relaxed-ms", type=float, default=250.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/disaggregation_capacity_cpu.json"))
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for slo_name, tbt_ms in (("strict", args.strict_ms), ("relaxed", args.relaxed_ms)):
            for arm in ARMS:
                results.setdefault(slo_name, {})[arm] = found = search(arm, slo_name, tbt_ms, args, Path(tmp))
                print(f"{slo_name} ({tbt_ms:g} ms) {arm}: {found['capacity_display']} "
                      f"({found['minutes']:.1f} min)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python -m benchmarks.disaggregation_capacity " + " ".join(sys.argv[1:]),
                                    "settings": {k: str(v) for k, v in vars(args).items()}, "capacity": results},
                                   indent=2) + "\n")


if __name__ == "__main__":
    main()
