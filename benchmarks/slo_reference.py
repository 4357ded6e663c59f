"""Stability of the relaxed SLO's decode reference on a loaded machine: the robust probe
(loadgen.sweep.slo.probe_reference) against the single-shot probe it replaced (the median token gap of one burst),
both measured ``--runs`` times, alternating, each on a freshly made target (``small`` in process, as a
new ``stallfree-bench`` process makes it), while a CPU burner (a busy-looping process) holds one core.

    python -m benchmarks.slo_reference [--runs 5] [--burners 1] [--out benchmarks/results/slo_reference.json]

Reports each method's values, their spread (max / min - 1) and the robust probe's disturbed flags.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.slo import probe_reference
from stallfree.loadgen.workload.request_specs import build_workload


def _burn() -> None:
    while True:
        pass


def single_shot_ms(cfg, target) -> float:
    """The earlier probe: the median token gap of one burst."""
    p = cfg.decode_probe
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": p.prompt_tokens, "output": p.output_tokens},
                           p.num_seqs, cfg.seed, target.vocab_size)
    records = target.replay(specs, warmup=0, progress=None).records
    return float(np.median(np.concatenate([np.diff(r.server_token_times) for r in records])) * 1e3)


def fresh(cfg, measure):
    """``measure(cfg, target)`` on a freshly made target (as a new stallfree-bench process makes it)."""
    targets = LiveTarget()
    try:
        return measure(cfg, targets.get(cfg, Path("/tmp/slo_reference_logs")))
    finally:
        targets.close()


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=1)
    parser.add_argument("--overrides", nargs="*", default=["model=small", "target=inprocess"])
    parser.add_argument("--out", default="benchmarks/results/slo_reference.json")
    args = parser.parse_args()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", args.overrides))
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    robust, single = [], []
    try:
        for run in range(args.runs):
            single.append(fresh(cfg, single_shot_ms))
            reference = fresh(cfg, probe_reference)
            robust.append(reference)
            print(f"run {run}: single-shot {single[-1]:.2f} ms, robust {reference.decode_iter_ms:.2f} ms "
                  f"(measurements {reference.measurements_ms}, disturbed {reference.disturbed})", flush=True)
    finally:
        for burner in burners:
            burner.kill()
    values = [r.decode_iter_ms for r in robust]
    result = {"overrides": args.overrides, "runs": args.runs, "cpu_burners": args.burners, "cpus": os.cpu_count(),
              "machine": "shared 2-core machine (other work running besides the burner)",
              "single_shot_ms": [round(v, 3) for v in single], "single_shot_spread": round(spread(single), 3),
              "robust_ms": [round(v, 3) for v in values], "robust_spread": round(spread(values), 3),
              "robust_disturbed": [r.disturbed for r in robust],
              "robust_measurements_ms": [r.measurements_ms for r in robust]}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("single_shot_spread", "robust_spread", "robust_ms")}))


if __name__ == "__main__":
    main()
