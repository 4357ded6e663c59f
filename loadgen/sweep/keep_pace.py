"""The rules a capacity point passes: the server met the SLO *and* kept pace with the offered load, judged
from what every target shows a client (the run summary's fields, engine.records.request_metrics).

* ``failed``: no request failed;
* ``tbt``: P99 TBT <= the SLO;
* ``completion``: the requests that ended ok within the steady window shifted by its median latency, over
  the window's requests (engine.records.request_metrics) >= ``capacity.min_completion_ratio``;
* ``client_delay``: the median client-side scheduling delay (TTFT - unloaded TTFT) <=
  ``capacity.max_p50_scheduling_delay_s``;
* ``delay_growth``: that delay grows by <= ``capacity.max_delay_growth_s`` from the first to the last third
  of the steady window (a queue that keeps building is a server falling behind, however short the run);
* ``length``: the point sent >= ``capacity.min_requests_per_in_flight`` x its peak in-flight requests (a
  burst that the server absorbs at once says nothing about the rate it sustains; the search measures a point
  that fails only this rule again, longer, and fails it as ``backlog`` when its peak in flight grew with the
  run: loadgen.sweep.capacity_search.backlogged);
* ``server_delay``: the server's own median scheduling delay <= the same bound, where the target reports it
  (stallfree-serve, inprocess); skipped, and said so, where it does not.
"""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.loadgen.config.search_groups import CapacityGroup


@dataclass(frozen=True)
class Check:
    rule: str
    passed: bool
    detail: str  # the measured value against its bound


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _at_most(rule: str, what: str, value: float | None, bound: float, unit: str, spec: str = ".4g") -> Check:
    ok = value is not None and value <= bound
    return Check(rule, ok, f"{what} {_fmt(value, spec)}{unit} {'<=' if ok else '>'} {bound:{spec}}{unit}")


def checks(summary: dict, slo_tbt_ms: float, c: CapacityGroup) -> list[Check]:
    """Every rule of the module docstring on one point's summary (``server_delay`` only where reported)."""
    max_delay_ms = c.max_p50_scheduling_delay_s * 1e3
    ratio, requests, peak = summary["completion_ratio"], summary["completed"] + summary["failed"], \
        summary["peak_in_flight"]
    delay_ms, growth_ms = summary["median_client_scheduling_delay_ms"], summary["client_scheduling_delay_growth_ms"]
    result = [
        Check("failed", summary["failed"] == 0, f"{summary['failed']} failed"),
        _at_most("tbt", "p99 TBT", summary["p99_tbt_ms"], slo_tbt_ms, " ms"),
        Check("completion", ratio is not None and ratio >= c.min_completion_ratio,
              f"completion {_fmt(ratio, '.2f')}x offered {'>=' if (ratio or 0) >= c.min_completion_ratio else '<'} "
              f"{c.min_completion_ratio:g}"),
        _at_most("client_delay", "p50 client delay", delay_ms, max_delay_ms, " ms"),
        _at_most("delay_growth", "its growth", growth_ms, c.max_delay_growth_s * 1e3, " ms"),
        Check("length", requests >= c.min_requests_per_in_flight * peak,
              f"{requests} requests {'>=' if requests >= c.min_requests_per_in_flight * peak else '<'} "
              f"{c.min_requests_per_in_flight:g} x peak in flight {peak}"),
    ]
    if summary.get("median_scheduling_delay_ms") is not None:
        result.append(_at_most("server_delay", "p50 server delay", summary["median_scheduling_delay_ms"],
                               max_delay_ms, " ms"))
    return result


def reason(results: list[Check]) -> str:
    """The failed checks' details, or every check's when all passed (a point's line and record)."""
    failed = [r for r in results if not r.passed]
    return "; ".join(r.detail for r in failed or results)
