"""An independent check of a capacity search: the search (loadgen.sweep.capacity_search), then an open-loop
Poisson run of ``--duration`` seconds at the capacity it reports, which must keep pace (completion rate >=
0.9 x offered, the client-side scheduling delay not growing: capacity.min_completion_ratio and
capacity.max_delay_growth_s), and one at twice that rate, which must not stay within the SLO (some rule of
loadgen.sweep.keep_pace fails). All three judge by the same SLO and unloaded TTFT (the experiment's
``.probes`` cache), on the same target.

    python -m benchmarks.capacity_check --url http://127.0.0.1:8300 --label vllm-cpu slo=relaxed model=path ...
    python -m benchmarks.capacity_check --smoke       # starts stallfree-serve model=tiny; short runs
    # writes benchmarks/results/capacity_check[_LABEL].json; the runs go to --results-dir (cached: a re-run resumes)

Arguments after the options are stallfree-bench overrides (workload, slo, capacity.*, num_requests, ...).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path

from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.keep_pace import checks
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.point import run_point
from stallfree.loadgen.sweep.slo import resolve_slo
from stallfree.loadgen.sweep.unloaded_ttft import cached_unloaded_ttft
from stallfree.loadgen.targets.server_process import ServerProcess, free_port

SMOKE = ["slo=relaxed", "workload=fixed", "workload.lengths.prompt=32", "workload.lengths.output=16",
         "num_requests=16", "capacity.start_qps=2", "capacity.min_duration_s=2", "capacity.max_qps=32",
         "capacity.tolerance=0.5"]
SMOKE_DURATION_S = 5.0


def bench_config(overrides: list[str]) -> BenchConfig:
    from hydra import compose, initialize_config_dir

    from stallfree.loadgen.config.checks import CONF_DIR, CONFIG_NAME, check

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return check(compose(CONFIG_NAME, overrides))


def open_loop_run(cfg: BenchConfig, targets: LiveTarget, qps: float, duration_s: float) -> dict:
    """A plain Poisson run of ``duration_s`` at ``qps``, judged by every keep-pace rule against the search's
    SLO and unloaded TTFT."""
    exp_dir = Path(cfg.results_dir) / cfg.experiment_name
    slo = resolve_slo(cfg, exp_dir, targets)
    unloaded, _ = cached_unloaded_ttft(cfg, exp_dir, targets)
    run_cfg = dataclasses.replace(cfg.with_qps(qps), num_requests=max(2, math.ceil(qps * duration_s)), mode="run")
    summary = run_point(run_cfg, targets, slo=slo, unloaded_ttft=unloaded)
    results = checks(summary, slo["slo_tbt_ms"], cfg.capacity)
    failed = {r.rule for r in results if not r.passed}
    keys = ("qps", "num_requests", "run_id", "completion_ratio", "median_client_scheduling_delay_ms",
            "client_scheduling_delay_growth_ms", "p99_tbt_ms", "median_ttft_ms", "failed", "slo_tbt_ms")
    return {**{k: summary[k] for k in keys}, "checks": [dataclasses.asdict(r) for r in results],
            "kept_pace": not failed & {"completion", "delay_growth", "failed"}, "within_slo": not failed}


def check(args: argparse.Namespace, url: str, duration: float, targets: LiveTarget) -> dict:
    """The search on ``url``, then the open-loop runs at its capacity and at twice it."""
    label = [f"target.label={args.label}"] if args.label else []
    cfg = bench_config(["mode=capacity", "experiment_name=capacity_check", f"results_dir={args.results_dir}",
                        "target=url", f"target.url={url}", *label, *(SMOKE if args.smoke else []), *args.overrides])
    search = run_search(cfg, targets)
    capacity = search["capacity_qps"]
    result = {"url": url, "label": args.label, "duration_s": duration, "overrides": args.overrides,
              "smoke": args.smoke, "search": search, "consistent": None}
    if capacity == 0:
        print(f"[capacity_check] {search['capacity_display']}: no rate passed, nothing to check", flush=True)
        return result
    at, double = (open_loop_run(cfg, targets, qps, duration) for qps in (capacity, 2 * capacity))
    result.update(at_capacity=at, at_double=double, consistent=at["kept_pace"] and not double["within_slo"])
    print(f"[capacity_check] {search['capacity_display']}: at it kept pace {at['kept_pace']} (completion "
          f"{at['completion_ratio']:.2f}x); at twice it within the SLO {double['within_slo']}; consistent: "
          f"{result['consistent']}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running OpenAI-compatible server; default: start stallfree-serve for --model")
    ap.add_argument("--model", default="tiny", help="the stallfree-serve model when no --url is given")
    ap.add_argument("--label", default=None, help="names the output file and the target in run ids")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals of each check run")
    ap.add_argument("--smoke", action="store_true", help=f"a short search and {SMOKE_DURATION_S:g} s check runs")
    ap.add_argument("--results-dir", default="results/capacity_check")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/capacity_check[_LABEL].json")
    ap.add_argument("overrides", nargs="*", help="stallfree-bench overrides")
    args = ap.parse_args()
    out = Path(args.out or f"benchmarks/results/capacity_check{'_' + args.label if args.label else ''}.json")
    duration = SMOKE_DURATION_S if args.smoke else args.duration
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            serve = [str(Path(sys.executable).with_name("stallfree-serve")), f"model={args.model}", f"port={port}"]
            stack.enter_context(ServerProcess(serve, url, Path(args.results_dir) / "stallfree-serve.log"))
        targets = LiveTarget()
        stack.callback(targets.close)
        result = check(args, url, duration, targets)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
