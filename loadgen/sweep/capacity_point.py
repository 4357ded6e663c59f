"""One point of a capacity search (loadgen.sweep.capacity_search): its record, and its verdict from a run's
summary by the rules of loadgen.sweep.keep_pace, with how sure the P99 TBT rule's verdict is (the P99's 95%
interval against the SLO) and the backlog verdict of a point whose queue grows with its length.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stallfree.loadgen.config.search_groups import CapacityGroup
from stallfree.loadgen.sweep.keep_pace import checks, reason


@dataclass
class Point:
    qps: float  # the offered load
    passed: bool  # every rule of loadgen.sweep.keep_pace held
    p99_tbt_ms: float | None = None
    median_scheduling_delay_ms: float | None = None  # server-side (None: the target does not report it)
    failed: int = 0  # failed requests
    run_id: str | None = None  # the point's run directory in the experiment
    num_requests: int | None = None  # sent: max(num_requests, qps x capacity.min_duration_s), capped
    completion_ratio: float | None = None  # the steady window's requests that kept pace (request_metrics; <= 1)
    median_client_scheduling_delay_ms: float | None = None  # TTFT - the unloaded TTFT of the prompt's length
    client_scheduling_delay_growth_ms: float | None = None  # last third - first third of the steady window
    failed_rules: list[str] = field(default_factory=list)  # loadgen.sweep.keep_pace rule names
    reason: str = ""  # the failed rules' values against their bounds (all rules' when it passed)
    disturbed: bool = False  # the run that decided the point was disturbed (loadgen.sweep.cpu_share)
    tbt_gaps: int | None = None  # the token gaps its P99 TBT rests on
    tbt_requests: int | None = None  # the ok requests they came from
    tbt_prefill_gaps: int | None = None  # of those, the gaps that ended in an iteration with prefill work
    p99_tbt_low_ms: float | None = None  # the P99 TBT's 95% interval (engine/records/quantile_bounds.py)
    p99_tbt_high_ms: float | None = None
    # whether that interval lies on one side of the SLO (False: another draw could flip the TBT rule's verdict;
    # None: no gaps)
    tbt_verdict_sure: bool | None = None
    unsure_remeasured: int = 0  # times it was measured again, longer, for an unsure TBT verdict (capacity.unsure_remeasures)


def backlogged(point: Point, previous_peak: int, peak: int) -> Point:
    """A point still short for its concurrency after a longer run whose peak in flight grew with it: the
    requests in flight scale with the run's length, a queue that builds (GuideLLM's over-saturation), so
    measuring longer again cannot pass it."""
    detail = (f"peak in flight {previous_peak} -> {peak} ({peak / previous_peak:.1f}x) on a run twice as long "
              "or more: a queue that builds")
    return dataclasses.replace(point, passed=False, failed_rules=[*point.failed_rules, "backlog"],
                               reason=f"{point.reason}; {detail}")


def point_from_summary(summary: dict, slo_tbt_ms: float, capacity: CapacityGroup) -> Point:
    """A point judged by the rules of loadgen.sweep.keep_pace against the search's SLO."""
    results = checks(summary, slo_tbt_ms, capacity)
    low, high = summary.get("p99_tbt_low_ms"), summary.get("p99_tbt_high_ms")  # None in summaries before them
    return Point(summary["qps"], all(r.passed for r in results), summary["p99_tbt_ms"],
                 summary["median_scheduling_delay_ms"], summary["failed"], summary["run_id"],
                 summary["completed"] + summary["failed"], summary["completion_ratio"],
                 summary["median_client_scheduling_delay_ms"], summary["client_scheduling_delay_growth_ms"],
                 [r.rule for r in results if not r.passed], reason(results), bool(summary.get("disturbed")),
                 summary.get("tbt_gaps"), summary.get("tbt_requests"), summary.get("tbt_prefill_gaps"), low, high,
                 tbt_verdict_sure(low, high, slo_tbt_ms))


def tbt_decides_unsure(point: Point) -> bool:
    """Whether another draw could flip the point's verdict: its TBT verdict is unsure and no other rule failed."""
    return point.tbt_verdict_sure is False and set(point.failed_rules) <= {"tbt"}


def interval_text(point: Point) -> str:
    """The P99 TBT's 95% interval, an end the samples cannot give as ``?``: ``[12.1, ?]``."""
    ends = ["?" if v is None else f"{v:.4g}" for v in (point.p99_tbt_low_ms, point.p99_tbt_high_ms)]
    return f"[{ends[0]}, {ends[1]}]"


def tbt_verdict_sure(low_ms: float | None, high_ms: float | None, slo_tbt_ms: float) -> bool | None:
    """Whether the P99 TBT's interval lies on one side of the SLO: below it when its upper bound is, above it
    when its lower bound is; None without gaps (no bounds)."""
    if low_ms is None and high_ms is None:
        return None
    return (high_ms is not None and high_ms <= slo_tbt_ms) or (low_ms is not None and low_ms > slo_tbt_ms)
