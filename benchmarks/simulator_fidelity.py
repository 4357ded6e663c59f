"""Simulator fidelity: the same workloads on the real engine and on ``runner=simulated`` (virtual clock),
in one run, and the error of each metric the studies report.

Workloads: an offline burst (all requests at once) and Poisson arrivals of arXiv-summarization lengths
scaled as in the demo, at several loads, for ``vllm`` and ``sarathi``-128. Metrics: output throughput,
P50 TTFT and P99 TBT. The cost model is read from ``--cost-model`` (see ``stallfree-profile``), or
profiled on this machine as ``stallfree-profile`` does, right before each policy's real runs: this VM's
speed drifts by 5-10% within tens of minutes, and a profile from an hour before predicted decode steps 9%
slow. Each real point is the median of ``--real-repeats`` runs (one real P99 TBT of ``vllm`` read 31 ms
and then 102 and 105 ms: a 1-QPS point's P99 sits at the edge of the few TBTs that prefills stall), and
each simulated point the median of ``--sim-seeds`` runs that draw other residuals.

    python -m benchmarks.simulator_fidelity [--model small] [--cost-model engine/simulator/fitting/cost_models/small-cpu.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from stallfree.engine import (
    CostModel,
    EngineConfig,
    LLMEngine,
    SamplingParams,
    check_speed,
    profile_cost_model,
)
from stallfree.engine.records.request_metrics import summarize
from stallfree.engine.simulator.fitting.speed_check import measure_speed
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload

METRICS = ("output_throughput", "median_ttft_ms", "p99_tbt_ms")
POLICIES = (("vllm", 512), ("sarathi", 128))
PROFILE_REQUESTS = 24  # per profiled policy, as stallfree-profile (conf/profile.yaml)
ARXIV_SCALED = {"kind": "trace", "name": "arxiv_summarization", "scale": 8, "shuffle": True}
# --long-prompts: arXiv summarization at half length (prompts of ~600 to ~2,000 tokens, median ~1,400)
ARXIV_LONG = {"kind": "trace", "name": "arxiv_summarization", "scale": 2, "shuffle": True}
# --prefix-caching: agent-like prompts on shared system prompts, the engine caching prefixes
SHARED_PREFIX = {"kind": "shared_prefix", "num_prefixes": 4, "prefix_len": 1024, "suffix_len": 128, "output_len": 32}


def run(engine_kwargs: dict, arrival: dict, lengths: dict, num_requests: int, max_total_tokens: int | None,
        cost_model: CostModel) -> dict:
    """One run's metrics. On a real runner, also the speed check's factors (actual / predicted by
    ``cost_model``, per iteration kind; the geometric mean of a check before and one after the replay) and
    the cost model's actual / predicted over the replay's own iterations (diagnostic only)."""
    config = EngineConfig.from_kwargs(**engine_kwargs)
    engine = LLMEngine(config, cost_model if config.model.runner == "simulated" else None)
    engine.add_request(list(range(10, 42)), SamplingParams(max_tokens=4))  # one-off costs out of the measurement
    while engine.has_unfinished():
        engine.step()
    real = config.model.runner == "model"
    before = check_speed(engine, cost_model) if real else None
    specs = build_workload(arrival, lengths, num_requests, 0, engine.vocab_size, max_total_tokens)
    result = replay(engine, specs, warmup=2)
    summary = summarize(requests_frame(result.records))
    metrics = {metric: summary[metric] for metric in METRICS}
    if not real:
        return metrics
    after = check_speed(engine, cost_model)
    factors = {kind: round(math.sqrt(before.factors[kind] * after.factors[kind]), 4) for kind in before.factors}
    replayed = measure_speed(result.batches, cost_model)
    return {**metrics, "speed_factors": factors, "replay_actual_over_predicted": replayed.factors}


def profile_now(base: dict, out: Path, policy: str) -> str:
    """A cost model profiled on this machine now, saved beside ``out``; its path."""
    path = str(out.with_name(f"{out.stem}_cost_model_{policy}.json"))
    profile_cost_model(EngineConfig.from_kwargs(**base), LLMEngine, num_requests=PROFILE_REQUESTS,
                       use_cache=False).save(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--cost-model", help="a cost model JSON (default: profile this machine's runner first)")
    ap.add_argument("--num-requests", type=int, default=80)
    ap.add_argument("--qps", default="1,2,3", help="Poisson loads, comma-separated")
    ap.add_argument("--offline", default="24x256x64", help="burst: REQUESTSxPROMPTxOUTPUT")
    ap.add_argument("--real-repeats", type=int, default=3,
                    help="real runs per point; each metric is their median (all are kept)")
    ap.add_argument("--sim-seeds", type=int, default=5, help="simulated runs per point (residual seeds); medians")
    ap.add_argument("--no-speed-check", action="store_true",
                    help="simulate only with the cost model as fitted (by default also rescaled by the speed "
                         "checks run beside the real runs)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="the Poisson points on a shared-prefix workload, real and simulated engines caching prefixes")
    ap.add_argument("--long-prompts", action="store_true",
                    help="the Poisson points on arXiv prompts at half length (hundreds to ~2,000 tokens), not /8")
    ap.add_argument("--out", default="benchmarks/results/simulator_fidelity.json")
    args = ap.parse_args()
    base = {"model": args.model}
    poisson_lengths, poisson_max_total = ((SHARED_PREFIX, None) if args.prefix_caching else
                                          (ARXIV_LONG, None) if args.long_prompts else (ARXIV_SCALED, 512))
    n, prompt, output = (int(x) for x in args.offline.split("x"))
    workloads = [("offline", {"kind": "burst"}, {"kind": "fixed", "prompt": prompt, "output": output}, n, None)]
    workloads += [(f"poisson-{qps}", {"kind": "poisson", "qps": float(qps)}, poisson_lengths, args.num_requests,
                   poisson_max_total) for qps in args.qps.split(",")]
    rows, cost_models = [], {}
    for policy, chunk_size in POLICIES:
        cost_model_path = args.cost_model or profile_now(base, Path(args.out), policy)
        cost_model = CostModel.load(cost_model_path)
        cost_models[f"{policy}-{chunk_size}"] = {"path": cost_model_path, "fitted_on": cost_model.fitted_on}
        for name, arrival, lengths, num_requests, max_total in workloads:
            kwargs = {**base, "scheduler": policy, "chunk_size": chunk_size,
                      "enable_prefix_caching": args.prefix_caching}
            real_runs = [run(kwargs, arrival, lengths, num_requests, max_total, cost_model)
                         for _ in range(args.real_repeats)]
            real = {m: statistics.median(r[m] for r in real_runs) for m in METRICS}
            # the speed the machine ran at around the real runs, by the checks beside them
            factors = {kind: statistics.median(r["speed_factors"][kind] for r in real_runs)
                       for kind in real_runs[0]["speed_factors"]}
            checked = cost_model.rescaled(factors, {"factors": factors, "of": "median of the real runs' checks"})
            simulated_by = {"fitted": cost_model} if args.no_speed_check else {"fitted": cost_model, "checked": checked}
            row = {"policy": f"{policy}-{chunk_size}", "workload": name, "real": real, "real_runs": real_runs,
                   "speed_factors": factors}
            for label, model in simulated_by.items():
                sim_runs = [run({**kwargs, "runner": "simulated", "clock": "virtual", "seed": seed}, arrival, lengths,
                                num_requests, max_total, model) for seed in range(args.sim_seeds)]
                simulated = {m: statistics.median(r[m] for r in sim_runs) for m in METRICS}
                errors = {m: (simulated[m] / real[m] - 1) * 100 if real[m] else None for m in METRICS}
                row[label] = {"simulated": simulated, "simulated_runs": sim_runs, "error_pct": errors}
                print(f"{policy}-{chunk_size:<4} {name:<12} {label:<7} " + "  ".join(
                    f"{m} {real[m]:.1f} vs {simulated[m]:.1f} ({errors[m]:+.0f}%)" for m in METRICS), flush=True)
            rows.append(row)
    result = {"model": args.model, "prefix_caching": args.prefix_caching, "long_prompts": args.long_prompts, "cost_models": cost_models, "real_repeats": args.real_repeats,
              "sim_seeds": args.sim_seeds, "runs": rows}
    poisson = [r for r in rows if r["workload"].startswith("poisson")]
    for label in ("fitted", "checked"):
        if label not in rows[0]:
            continue
        worst = {m: max(abs(r[label]["error_pct"][m]) for r in rows if r[label]["error_pct"][m] is not None)
                 for m in METRICS}
        within = sum(abs(r[label]["error_pct"]["p99_tbt_ms"]) <= 10 for r in poisson)
        within_15 = {m: f"{sum(abs(r[label]['error_pct'][m]) <= 15 for r in poisson)} of {len(poisson)}"
                     for m in ("median_ttft_ms", "p99_tbt_ms")}
        result[label] = {"worst_abs_error_pct": worst, "poisson_p99_tbt_within_10pct": f"{within} of {len(poisson)}",
                         "poisson_within_15pct": within_15}
        print(f"{label}: worst |error| %: " + ", ".join(f"{m} {v:.1f}" for m, v in worst.items())
              + f"; Poisson P99 TBT within 10%: {within} of {len(poisson)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
