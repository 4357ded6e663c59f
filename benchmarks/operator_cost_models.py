"""Write the operator cost model of each of the paper's deployments as JSON: every input file
(repository, commit, path), every modelled assumption, the fitted parameters and the operator times.

    python -m benchmarks.operator_cost_models   # -> benchmarks/results/operator_cost_models/<gpu>-<shape>-tp<N>.json

It also times ``stage_seconds`` (calls/s on a mix of hybrid, decode-only and prefill-only batches, each
through one stage or two) and writes that to benchmarks/results/stage_seconds_speed.json.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from stallfree.engine.simulator.ops import OperatorCostModel, StageBatch
from stallfree.engine.simulator.shapes import SHAPES

# (gpu, shape, tp, interconnect): the Sarathi-Serve paper's deployments, Falcon at TP8, Llama-3-8B on an H100
DEPLOYMENTS = (
    ("a100", "mistral-7b", 1, "nvlink"),
    ("a100", "yi-34b", 2, "nvlink"),
    ("a40", "llama2-70b", 4, "pcie"),
    ("a100", "falcon-180b", 4, "nvlink-internode"),
    ("a100", "falcon-180b", 8, "nvlink-internode"),
    ("h100", "llama3-8b", 1, "nvlink"),
)


def sample_batches(count: int, seed: int = 0) -> list[StageBatch]:
    """Batches like a scheduler's: up to 128 decodes of 100-4000 tokens, with 0-2 prefill chunks."""
    rng = random.Random(seed)
    batches = []
    for _ in range(count):
        decodes = tuple(rng.randint(100, 4000) for _ in range(rng.randint(0, 128)))
        chunks = tuple((rng.choice((64, 256, 512, 1000, 2048)), rng.randint(0, 3000)) for _ in range(rng.randint(0, 2)))
        batches.append(StageBatch(chunks, decodes) if chunks or decodes else StageBatch(((512, 0),), ()))
    return batches


def calls_per_second(model: OperatorCostModel, batches: list[StageBatch], num_layers: int, stages: int) -> float:
    """stage_seconds calls/s when each micro-batch goes through ``stages`` pipeline stages."""
    per_stage = num_layers // stages
    start = time.perf_counter()
    for batch in batches:
        for stage in range(stages):
            model.stage_seconds(batch, per_stage, first=stage == 0, last=stage == stages - 1)
    return len(batches) * stages / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/operator_cost_models"))
    ap.add_argument("--speed-out", type=Path, default=Path("benchmarks/results/stage_seconds_speed.json"))
    ap.add_argument("--calls", type=int, default=100_000)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    speed = {"machine": "shared 2-core CPU (other jobs running)", "calls": args.calls, "deployments": {}}
    for gpu, shape, tp, interconnect in DEPLOYMENTS:
        start = time.perf_counter()
        model = OperatorCostModel.build(gpu, SHAPES[shape], tp, interconnect)
        build_s = time.perf_counter() - start
        path = args.out_dir / f"{gpu}-{shape}-tp{tp}.json"
        path.write_text(json.dumps(model.describe(), indent=1) + "\n")
        # fresh batch objects for the timed calls: their cached token sums are computed inside the timing
        layers = SHAPES[shape].num_layers
        one = calls_per_second(model, sample_batches(args.calls), layers, stages=1)
        two = calls_per_second(model, sample_batches(args.calls), layers, stages=2)
        speed["deployments"][path.stem] = {"build_s": round(build_s, 3), "calls_per_s_pp1": round(one),
                                           "calls_per_s_pp2": round(two)}
        print(f"{path}: built in {build_s:.2f} s; stage_seconds {one:,.0f} calls/s (PP1), {two:,.0f} (PP2)")
    args.speed_out.parent.mkdir(parents=True, exist_ok=True)
    args.speed_out.write_text(json.dumps(speed, indent=1) + "\n")


if __name__ == "__main__":
    main()
