"""Capacity search: the highest QPS at which the server keeps pace with the offered load within the SLO
(the rules: loadgen.sweep.keep_pace).

From ``capacity.start_qps`` the search doubles (or halves) until it has a passing ``lo`` and a
failing ``hi``, then bisects until ``hi - lo <= tolerance * lo``. Every point is a cached run of
``stallfree-bench`` (loadgen.sweep.point.run_point) of ``capacity.num_requests(qps)`` requests (long
enough to be a load test, not a burst; one that fails only for being short for the requests it kept in
flight is measured again, longer, and fails as ``backlog`` when its peak in flight grew with the run; one whose
verdict hangs on a P99 TBT whose 95% interval straddles the SLO is measured again with twice the requests,
``capacity.unsure_remeasures`` times at most), so an interrupted search resumes where it stopped. The SLO and
the unloaded TTFT (the baseline of the client-side scheduling delay, loadgen.sweep.unloaded_ttft) are
resolved once, before the first point, and every point is judged against them.
Invariant: every passing point is <= lo < hi <= every failing point. Results go to
``<results_dir>/<experiment_name>/capacity.json``: a list of {scheduler, chunk_size, max_num_seqs, slo_name,
slo_tbt_ms, the SLO reference and how it was measured, unloaded_ttft, capacity_qps (mean over repeats),
capacity_bound (exact | lower | upper, engine.records.capacity_bound), capacity_display, capacity_ci_lo /
capacity_ci_hi (its 95% interval), ..., points} rebuilt from one file per search in ``.capacity/``.

``stallfree-capacity ARGS`` is ``stallfree-bench +experiment=capacity ARGS``. On a running server
(``target.url``) the preset's scheduler values name the same search (the bench's scheduler does not
configure that server): a job whose search this process already ran says so in one line and returns it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from stallfree.engine.records.capacity_bound import capacity_text, mean_bound, search_bound
from stallfree.engine.records.repeat_stats import mean_interval
from stallfree.engine.records.request_metrics import UnloadedTtft
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.results.run_dir import make_run_id
from stallfree.loadgen.sweep.capacity_point import (
    Point,
    backlogged,
    interval_text,
    point_from_summary,
    tbt_decides_unsure,
)
from stallfree.loadgen.sweep.experiment_lock import experiment_lock
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.plan import plan_run
from stallfree.loadgen.sweep.point import repeat_configs, repeat_part, run_point
from stallfree.loadgen.sweep.progress import RunPart
from stallfree.loadgen.sweep.slo import reference_text, resolve_slo
from stallfree.loadgen.sweep.unloaded_ttft import cached_unloaded_ttft

BACKLOG_GROWTH = 1.5  # peak in flight this much higher on a run >= 2x as long: the server falls behind
RUN_PARAMS = ("model", "target", "workload", "arrival", "seed", "num_requests", "prefix_caching")  # into each record
_searched: dict[Path, str] = {}  # the searches this process ran: record file -> the job that ran it


@dataclass
class Search:
    capacity_qps: float  # the highest passing qps; 0.0 when none passed
    lo_qps: float | None  # highest passing point
    hi_qps: float | None  # lowest failing point (None: max_qps passed, the capacity is a lower bound)
    points: list[Point]  # in the order measured

    @property
    def bracketed(self) -> bool:
        return self.lo_qps is not None and self.hi_qps is not None

    @property
    def bound(self) -> str:
        return search_bound(self.lo_qps, self.hi_qps)


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


def _search_one(cfg: BenchConfig, targets: LiveTarget, slo: dict, unloaded: UnloadedTtft, repeat: int) -> Search:
    """One search on the seed of repeat ``repeat``, every point judged against ``slo``. A point whose run
    was disturbed (summary ``disturbed``: the engine, or the load generator, got too little CPU) is measured
    once more, until a second measurement is disturbed too: then the disturbance is steady (a server that
    takes every core beside its load generator), measuring again cannot clear it, and the search says so
    once and keeps its points marked disturbed."""
    c, points = cfg.capacity, []
    steady: list[str] = []  # the reason of a disturbance that a second measurement did not clear

    def run(qps: float, num_requests: int, part: RunPart) -> dict:
        point_cfg = dataclasses.replace(cfg.with_qps(qps), num_requests=num_requests)
        args = {"capacity_slo": cfg.slo.name, "part": part, "slo": slo, "unloaded_ttft": unloaded}
        summary = run_point(point_cfg, targets, **args)
        if summary.get("disturbed") and not steady:
            print(f"  qps {qps:g}: disturbed run, measuring again", flush=True)
            summary = run_point(point_cfg, targets, rerun=True, **args)
            if summary.get("disturbed"):
                steady.append(summary.get("disturbed_reason") or "disturbed")
                print(f"[capacity] WARNING: measured again, qps {qps:g} is still disturbed "
                      f"({steady[0]}): a steady disturbance; the search's other points are not measured "
                      "again and stay marked disturbed", flush=True)
        return summary

    def measure(qps: float) -> Point:
        share = (len(points) + 1) / (len(points) + probes_left(points, c.min_qps, c.max_qps, c.tolerance))
        part = repeat_part(cfg, repeat, min(share, 1.0))
        part.extras["qps"] = qps
        num_requests, previous_peak, unsure_runs = c.num_requests(qps, cfg.num_requests), None, 0
        while True:  # measured again, longer: a point short for its concurrency, or one an unsure P99 TBT decides
            summary = run(qps, num_requests, part)
            point = dataclasses.replace(point_from_summary(summary, slo["slo_tbt_ms"], c), unsure_remeasured=unsure_runs)
            peak = summary["peak_in_flight"]
            if point.failed_rules == ["length"] and previous_peak and peak >= BACKLOG_GROWTH * previous_peak:
                point = backlogged(point, previous_peak, peak)
                break
            if point.failed_rules == ["length"]:
                longer, why = c.longer(num_requests, peak), f"{peak} in flight at once"
            elif tbt_decides_unsure(point) and unsure_runs < c.unsure_remeasures:
                longer, why = c.doubled(num_requests), (
                    f"P99 TBT {point.p99_tbt_ms:.4g} ms, its 95% interval {interval_text(point)} ms straddles the "
                    f"SLO {slo['slo_tbt_ms']:.4g} ms")
                unsure_runs += 1
            else:
                break
            if longer <= num_requests:
                break
            previous_peak = peak
            print(f"  qps {qps:g}: {num_requests} requests, {why}: measuring again with {longer}", flush=True)
            num_requests = longer
        if not points and point.median_scheduling_delay_ms is None:
            print("[capacity] the target reports no server-side scheduling delay: points are judged by the "
                  "client-side rules (completion rate, client-side scheduling delay and its growth)", flush=True)
        points.append(point)
        print(f"  qps {qps:g} ({point.num_requests} requests): {'pass' if point.passed else 'fail'} - "
              f"{point.reason}", flush=True)
        return point

    return search(measure, c.start_qps, c.min_qps, c.max_qps, c.tolerance)


def run_search(cfg: BenchConfig, targets: LiveTarget) -> dict:
    """Search the capacity of the config's scheduler / chunk size under its SLO, once per repeat (seeds
    seed, seed + 1, ...); record and return it with the mean capacity, its bound and its 95% interval."""
    exp_dir = Path(cfg.results_dir) / cfg.experiment_name
    plan = plan_run(cfg, capacity_slo=cfg.slo.name)
    key = make_run_id({"scheduler": plan.params["scheduler"], "chunk_size": plan.params["chunk_size"],
                       "slo": cfg.slo.name, "cfg": plan.digest})
    job, record_path = f"scheduler={cfg.scheduler.policy} slo={cfg.slo.name}", exp_dir / ".capacity" / f"{key}.json"
    if record_path in _searched and record_path.is_file():
        print(f"[capacity] {job}: same search as {_searched[record_path]} ({plan.params['scheduler']}), "
              "not run again", flush=True)
        return json.loads(record_path.read_text())
    slo = resolve_slo(cfg, exp_dir, targets)  # once: every point of every repeat is judged against it
    unloaded, unloaded_record = cached_unloaded_ttft(cfg, exp_dir, targets)
    results = [_search_one(repeat_cfg, targets, slo, unloaded, repeat)
               for repeat, repeat_cfg in enumerate(repeat_configs(cfg))]
    interval = mean_interval([r.capacity_qps for r in results])
    bound = mean_bound([r.bound for r in results])
    display = capacity_text(interval.mean, bound, min(p.qps for r in results for p in r.points), unit=" qps")
    first = results[0]
    record = {"scheduler": plan.params["scheduler"], "chunk_size": plan.params["chunk_size"],
              "max_num_seqs": None if plan.params["policy"] is None else cfg.scheduler.max_num_seqs, **slo,
              "unloaded_ttft": unloaded_record,
              "capacity_qps": interval.mean, "capacity_bound": bound, "capacity_display": display,
              "capacity_ci_lo": interval.lo, "capacity_ci_hi": interval.hi,
              "capacity_qps_repeats": [r.capacity_qps for r in results],
              "bracketed": all(r.bracketed for r in results), "lo_qps": first.lo_qps, "hi_qps": first.hi_qps,
              "capacity": asdict(cfg.capacity),
              **{k: plan.params[k] for k in RUN_PARAMS},
              "disturbed_points": sum(p.disturbed for r in results for p in r.points),
              "unsure_tbt_points": sum(p.tbt_verdict_sure is False for r in results for p in r.points),
              "points": [asdict(p) for r in results for p in r.points]}
    with experiment_lock(exp_dir):
        _write_atomic(record_path, record)
        rebuild_capacity_json(exp_dir)
    _searched[record_path] = job
    spread = f" [95% CI {interval.lo:.3g}, {interval.hi:.3g}]" if len(results) > 1 and bound == "exact" else ""
    chunk = "" if plan.params["chunk_size"] is None else f" chunk_size={plan.params['chunk_size']}"
    print(f"[capacity] {plan.params['scheduler']}{chunk} slo={cfg.slo.name} "
          f"({slo['slo_tbt_ms']:.0f} ms, {reference_text(slo)}): {display}{spread}, "
          f"{sum(len(r.points) for r in results)} points"
          + (f" ({record['disturbed_points']} disturbed)" if record["disturbed_points"] else "")
          + (f" ({record['unsure_tbt_points']} decided on an unsure P99 TBT)" if record["unsure_tbt_points"] else ""),
          flush=True)
    return record
