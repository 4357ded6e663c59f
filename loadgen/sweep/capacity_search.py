"""Capacity search: the highest QPS whose run has P99 TBT <= the SLO and P50 scheduling delay <= a
bound (``capacity.max_p50_scheduling_delay_s``, 2 s by default), with no failed request.

From ``capacity.start_qps`` the search doubles (or halves) until it has a passing ``lo`` and a
failing ``hi``, then bisects until ``hi - lo <= tolerance * lo``. Every point is a cached run of
``stallfree-bench`` (loadgen.sweep.point.run_point), so an interrupted search resumes where it stopped.
Invariant: every passing point is <= lo < hi <= every failing point. Results go to
``<results_dir>/<experiment_name>/capacity.json``: a list of {scheduler, chunk_size, slo_name,
slo_tbt_ms, capacity_qps (mean over repeats), capacity_ci_lo / capacity_ci_hi (its 95% interval),
..., points} rebuilt from one file per search in ``.capacity/``.

``stallfree-capacity ARGS`` is ``stallfree-bench +experiment=capacity ARGS``. On a running server
(``target.url``) the preset's scheduler values name the same search (the bench's scheduler does not
configure that server): a job whose search this process already ran says so in one line and returns it.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from stallfree.loadgen.results.repeat_stats import mean_interval
from stallfree.loadgen.results.run_dir import make_run_id
from stallfree.loadgen.sweep.bench_schema import BenchConfig
from stallfree.loadgen.sweep.experiment_lock import experiment_lock
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.plan import plan_run
from stallfree.loadgen.sweep.point import repeat_configs, repeat_part, run_point
from stallfree.loadgen.sweep.slo import reference_text, resolve_slo

RUN_PARAMS = ("model", "target", "workload", "arrival", "seed", "num_requests")  # copied into each record
_searched: dict[str, str] = {}  # the searches this process ran: record key -> the job that ran it


@dataclass
class Point:
    qps: float
    passed: bool
    p99_tbt_ms: float | None
    median_scheduling_delay_ms: float | None
    failed: int
    run_id: str | None = None


@dataclass
class Search:
    capacity_qps: float  # the highest passing qps; 0.0 when none passed
    lo_qps: float | None  # highest passing point
    hi_qps: float | None  # lowest failing point (None: max_qps passed, the capacity is a lower bound)
    points: list[Point]  # in the order measured

    @property
    def bracketed(self) -> bool:
        return self.lo_qps is not None and self.hi_qps is not None


def _round(qps: float) -> float:
    """Three significant digits, so the run ids of bisection points stay short and stable."""
    return float(f"{qps:.3g}")


def search(measure: Callable[[float], Point], start_qps: float, min_qps: float, max_qps: float,
           tolerance: float) -> Search:
    """Bracket by doubling / halving from start_qps within [min_qps, max_qps], then bisect."""
    points: list[Point] = []
    lo = hi = None

    def probe(qps: float) -> None:
        nonlocal lo, hi
        point = measure(qps)
        points.append(point)
        if point.passed:
            lo = qps
        else:
            hi = qps

    qps = _round(start_qps)
    probe(qps)
    while hi is None and qps < max_qps:
        qps = _round(min(2 * qps, max_qps))
        probe(qps)
    while lo is None and qps > min_qps:
        qps = _round(max(qps / 2, min_qps))
        probe(qps)
    while lo is not None and hi is not None and hi - lo > tolerance * lo:
        mid = _round((lo + hi) / 2)
        if not lo < mid < hi:
            break
        probe(mid)
    return Search(lo or 0.0, lo, hi, points)


def probes_left(points: list[Point], min_qps: float, max_qps: float, tolerance: float) -> int:
    """An estimate of the probes a search that measured ``points`` still makes: the bisections a bracket
    needs, plus, before there is one, the probe expected to close it."""
    def bisections(lo: float, hi: float) -> int:
        return max(0, math.ceil(math.log2((hi - lo) / (tolerance * lo))))

    lo = max((p.qps for p in points if p.passed), default=None)
    hi = min((p.qps for p in points if not p.passed), default=None)
    if lo is not None and hi is not None:
        return bisections(lo, hi)
    if (lo is not None and lo >= max_qps) or (hi is not None and hi <= min_qps):
        return 0
    return (1 if points else 2) + bisections(1.0, 2.0)  # the next doubling / halving closes a bracket


def point_from_summary(summary: dict, slo_tbt_ms: float, max_delay_ms: float) -> Point:
    p99, delay, failed = summary["p99_tbt_ms"], summary["median_scheduling_delay_ms"], summary["failed"]
    passed = (failed == 0 and p99 is not None and p99 <= slo_tbt_ms
              and (delay is None or delay <= max_delay_ms))
    return Point(summary["qps"], passed, p99, delay, failed, summary["run_id"])


def _write_atomic(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)


def rebuild_capacity_json(exp_dir: Path) -> list[dict]:
    """exp_dir/capacity.json from the per-search records in exp_dir/.capacity/."""
    records = [json.loads(p.read_text()) for p in sorted((exp_dir / ".capacity").glob("*.json"))]
    _write_atomic(exp_dir / "capacity.json", records)
    return records


def _search_one(cfg: BenchConfig, targets: LiveTarget, slo: dict, max_delay_ms: float, repeat: int) -> Search:
    """One search on the seed of repeat ``repeat``. A point whose run was disturbed (summary
    ``disturbed``: the engine got too little CPU) is measured once more."""
    c, points = cfg.capacity, []

    def measure(qps: float) -> Point:
        point_cfg = cfg.with_qps(qps)
        share = (len(points) + 1) / (len(points) + probes_left(points, c.min_qps, c.max_qps, c.tolerance))
        part = repeat_part(cfg, repeat, min(share, 1.0))
        part.extras["qps"] = qps
        summary = run_point(point_cfg, targets, capacity_slo=cfg.slo.name, part=part)
        if summary.get("disturbed"):
            print(f"  qps {qps:g}: disturbed run, measuring again", flush=True)
            summary = run_point(point_cfg, targets, capacity_slo=cfg.slo.name, rerun=True, part=part)
        point = point_from_summary(summary, slo["slo_tbt_ms"], max_delay_ms)
        points.append(point)
        print(f"  qps {qps:g}: {'pass' if point.passed else 'fail'}", flush=True)
        return point

    return search(measure, c.start_qps, c.min_qps, c.max_qps, c.tolerance)


def run_search(cfg: BenchConfig, targets: LiveTarget) -> dict:
    """Search the capacity of the config's scheduler / chunk size under its SLO, once per repeat (seeds
    seed, seed + 1, ...); record and return it with the mean capacity and its 95% interval."""
    exp_dir = Path(cfg.results_dir) / cfg.experiment_name
    plan = plan_run(cfg, capacity_slo=cfg.slo.name)
    key = make_run_id({"scheduler": plan.params["scheduler"], "chunk_size": plan.params["chunk_size"],
                       "slo": cfg.slo.name, "cfg": plan.digest})
    job = f"scheduler={cfg.scheduler.name} slo={cfg.slo.name}"
    if key in _searched:
        print(f"[capacity] {job}: same search as {_searched[key]} ({plan.params['scheduler']}), not run again",
              flush=True)
        return json.loads((exp_dir / ".capacity" / f"{key}.json").read_text())
    slo = resolve_slo(cfg, exp_dir, targets)
    max_delay_ms = cfg.capacity.max_p50_scheduling_delay_s * 1e3
    results = [_search_one(repeat_cfg, targets, slo, max_delay_ms, repeat)
               for repeat, repeat_cfg in enumerate(repeat_configs(cfg))]
    interval = mean_interval([r.capacity_qps for r in results])
    first = results[0]
    record = {"scheduler": plan.params["scheduler"], "chunk_size": plan.params["chunk_size"], **slo,
              "capacity_qps": interval.mean, "capacity_ci_lo": interval.lo, "capacity_ci_hi": interval.hi,
              "capacity_qps_repeats": [r.capacity_qps for r in results],
              "bracketed": all(r.bracketed for r in results), "lo_qps": first.lo_qps, "hi_qps": first.hi_qps,
              "max_p50_scheduling_delay_ms": max_delay_ms, "tolerance": cfg.capacity.tolerance,
              **{k: plan.params[k] for k in RUN_PARAMS},
              "points": [asdict(p) for r in results for p in r.points]}
    with experiment_lock(exp_dir):
        _write_atomic(exp_dir / ".capacity" / f"{key}.json", record)
        rebuild_capacity_json(exp_dir)
    _searched[key] = job
    bound = "" if record["bracketed"] else " (max_qps passed)" if first.lo_qps else " (none passed)"
    spread = f" [95% CI {interval.lo:.3g}, {interval.hi:.3g}]" if len(results) > 1 else ""
    chunk = "" if plan.params["chunk_size"] is None else f" chunk_size={plan.params['chunk_size']}"
    print(f"[capacity] {plan.params['scheduler']}{chunk} slo={cfg.slo.name} "
          f"({slo['slo_tbt_ms']:.0f} ms, {reference_text(slo)}): {interval.mean:g} qps{spread}{bound}, "
          f"{sum(len(r.points) for r in results)} points", flush=True)
    return record
