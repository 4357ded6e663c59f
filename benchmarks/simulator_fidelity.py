"""Simulator fidelity: the same workloads on the real engine and on ``runner=simulated`` (virtual clock),
in one run, and the error of each metric the studies report.

Workloads: an offline burst (all requests at once) and Poisson arrivals of arXiv-summarization lengths
scaled as in the demo, at several loads, for ``vllm`` and ``sarathi``-128. Metrics: output throughput,
P50 TTFT and P99 TBT. The cost model is read from ``--cost-model`` (see ``stallfree-profile``), or
profiled on this machine first. ``--real-repeats`` runs the real engine more than once per point (a
2-core machine shared with other jobs gave one real point 41.5 and then 67.8 and 61.4 tok/s).

    python -m benchmarks.simulator_fidelity [--model small] [--cost-model engine/runner/cost_models/small-cpu.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from stallfree.engine import CostModel, EngineConfig, LLMEngine, SamplingParams, profile_cost_model
from stallfree.loadgen.results.request_metrics import summarize
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload

METRICS = ("output_throughput", "median_ttft_ms", "p99_tbt_ms")
POLICIES = (("vllm", 512), ("sarathi", 128))
ARXIV_SCALED = {"kind": "trace", "name": "arxiv_summarization", "scale": 8, "shuffle": True}


def run(engine_kwargs: dict, arrival: dict, lengths: dict, num_requests: int, max_total_tokens: int | None) -> dict:
    engine = LLMEngine.from_kwargs(**engine_kwargs)
    engine.add_request(list(range(10, 42)), SamplingParams(max_tokens=4))  # one-off costs out of the measurement
    while engine.has_unfinished():
        engine.step()
    specs = build_workload(arrival, lengths, num_requests, 0, engine.vocab_size, max_total_tokens)
    summary = summarize(requests_frame(replay(engine, specs, warmup=2).records))
    return {metric: summary[metric] for metric in METRICS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--cost-model", help="a cost model JSON (default: profile this machine's runner first)")
    ap.add_argument("--num-requests", type=int, default=40)
    ap.add_argument("--qps", default="1,2,3", help="Poisson loads, comma-separated")
    ap.add_argument("--offline", default="24x256x64", help="burst: REQUESTSxPROMPTxOUTPUT")
    ap.add_argument("--real-repeats", type=int, default=1,
                    help="real runs per point; each metric is their median (all are kept)")
    ap.add_argument("--out", default="benchmarks/results/simulator_fidelity.json")
    args = ap.parse_args()
    base = {"model": args.model}
    cost_model_path = args.cost_model
    if cost_model_path is None:
        cost_model_path = str(Path(args.out).with_name("simulator_fidelity_cost_model.json"))
        profile_cost_model(EngineConfig.from_kwargs(**base), LLMEngine, use_cache=False).save(cost_model_path)
    n, prompt, output = (int(x) for x in args.offline.split("x"))
    workloads = [("offline", {"kind": "burst"}, {"kind": "fixed", "prompt": prompt, "output": output}, n, None)]
    workloads += [(f"poisson-{qps}", {"kind": "poisson", "qps": float(qps)}, ARXIV_SCALED, args.num_requests, 512)
                  for qps in args.qps.split(",")]
    rows = []
    for policy, chunk_size in POLICIES:
        for name, arrival, lengths, num_requests, max_total in workloads:
            kwargs = {**base, "scheduler": policy, "chunk_size": chunk_size}
            real_runs = [run(kwargs, arrival, lengths, num_requests, max_total) for _ in range(args.real_repeats)]
            real = {m: statistics.median(r[m] for r in real_runs) for m in METRICS}
            simulated = run({**kwargs, "runner": "simulated", "clock": "virtual", "cost_model": cost_model_path},
                            arrival, lengths, num_requests, max_total)
            errors = {m: (simulated[m] / real[m] - 1) * 100 if real[m] else None for m in METRICS}
            rows.append({"policy": f"{policy}-{chunk_size}", "workload": name, "real": real, "real_runs": real_runs,
                         "simulated": simulated, "error_pct": errors})
            print(f"{policy}-{chunk_size:<4} {name:<12} " + "  ".join(
                f"{m} {real[m]:.1f} vs {simulated[m]:.1f} ({errors[m]:+.0f}%)" for m in METRICS), flush=True)
    worst = {m: max(abs(r["error_pct"][m]) for r in rows if r["error_pct"][m] is not None) for m in METRICS}
    result = {"model": args.model, "cost_model": cost_model_path,
              "cost_model_fitted_on": CostModel.load(cost_model_path).fitted_on, "runs": rows,
              "worst_abs_error_pct": worst}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("worst |error| %: " + ", ".join(f"{m} {v:.1f}" for m, v in worst.items()))


if __name__ == "__main__":
    main()
