"""Whole-prompt prefills up to ``max_model_len`` against the cost model the simulator uses: a lone prompt of each
length (``vllm``: one prefill-only iteration) on the real engine, its time over the cost model's prediction.

The speed check (engine/simulator/fitting/speed_check.py) runs prompts up to 512 tokens; ``vllm``'s tail under long
prompts is set by whole prompts of thousands. The cost model is the one ``runner=simulated`` profiles for this
config (cached as ``stallfree-profile`` keeps it), or ``--cost-model``. Rounds alternate over the lengths.

    python -m benchmarks.prefill_fit [--model small] [--max-model-len 4096] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from stallfree.engine import (
    CostModel,
    EngineConfig,
    IterationFeatures,
    LLMEngine,
    SamplingParams,
    profile_cost_model,
)
from stallfree.engine.records.machine import cpu_description


def lone_prefill_seconds(engine: LLMEngine, prompt: list[int]) -> tuple[float, IterationFeatures]:
    """The prefill-only iteration of ``prompt`` alone: its seconds and features."""
    first = len(engine.batch_records)
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    record = engine.batch_records[first]
    return record.end_time - record.start_time, IterationFeatures.of(record)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--lengths", default="256,512,1024,2048,3072", help="prompt lengths; max_model_len - 1 is added")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cost-model", help="a cost model JSON (default: the one runner=simulated profiles)")
    ap.add_argument("--out", default="benchmarks/results/prefill_fit.json")
    args = ap.parse_args()
    base = {"model": args.model, "max_model_len": args.max_model_len, "scheduler": "vllm"}
    model = (CostModel.load(args.cost_model) if args.cost_model else
             profile_cost_model(EngineConfig.from_kwargs(**base, runner="simulated"), LLMEngine.from_config))
    engine = LLMEngine.from_kwargs(**base)
    lengths = [int(n) for n in args.lengths.split(",")] + [args.max_model_len - 1]
    rng = random.Random(0)
    ratios: dict[int, list[float]] = {n: [] for n in lengths}
    rows = []
    lone_prefill_seconds(engine, [5] * 64)  # the engine's first iterations carry one-off costs
    for round_ in range(args.rounds):
        for length in lengths:
            seconds, features = lone_prefill_seconds(engine, [rng.randrange(3, engine.vocab_size)
                                                              for _ in range(length)])
            predicted = model.predict(features)
            ratios[length].append(seconds / predicted)
            rows.append({"round": round_, "prompt_tokens": length, "seconds": seconds, "predicted_s": predicted})
            print(f"{length:>6} tokens: {seconds * 1000:8.1f} ms, predicted {predicted * 1000:8.1f} ms, "
                  f"actual / predicted {seconds / predicted:.3f}", flush=True)
    result = {"command": " ".join(["python -m benchmarks.prefill_fit", *sys.argv[1:]]), "machine": cpu_description(),
              "cost_model_fitted_on": model.fitted_on, "rows": rows,
              "median_actual_over_predicted": {n: round(statistics.median(r), 4) for n, r in ratios.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median actual / predicted by prompt length: {result['median_actual_over_predicted']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
