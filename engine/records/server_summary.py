"""The run summary's server-side figures, from the server's own metrics scraped during the run
(server_metrics.parquet: time, metric, value, series; vocabulary in loadgen.targets.server_vocabulary).

Peaks are over every scrape of the replay; counter increases are the sum of their rises between scrapes
(a server restart's reset is not counted as a fall). ``server_queue_growing`` marks a saturated server:
over the arrival window (first to last intended send of the measured requests), the waiting queue's
mean in the last quarter of the window is at least ``QUEUE_GROWTH_MIN_REQUESTS`` and at least its mean
in the first quarter above that first-quarter mean (so at least doubled), and its least-squares trend over
the window rises. It is None (not known) without ``MIN_WINDOW_SCRAPES`` scrapes in the window or one in
each quarter.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

QUEUE_GROWTH_MIN_REQUESTS = 4.0
EDGE_SHARE = 0.25
MIN_WINDOW_SCRAPES = 4


def _values(series: pd.DataFrame, metric: str) -> pd.DataFrame:
    return series.loc[series["metric"] == metric, ["time", "value"]].sort_values("time")


def _peak(series: pd.DataFrame, metric: str) -> float | None:
    values = _values(series, metric)["value"]
    return float(values.max()) if len(values) else None


def counter_increase(series: pd.DataFrame, metric: str) -> float | None:
    """How much a counter rose over the scrapes (None: fewer than two)."""
    values = _values(series, metric)["value"].to_numpy()
    return float(np.clip(np.diff(values), 0, None).sum()) if len(values) >= 2 else None


def queue_growing(series: pd.DataFrame, window: tuple[float, float] | None) -> bool | None:
    """Whether the waiting queue grew over the arrival window (see the module docstring)."""
    if window is None or not window[1] > window[0]:
        return None
    start, end = window
    waiting = _values(series, "requests_waiting")
    waiting = waiting[waiting["time"].between(start, end)]
    edge = EDGE_SHARE * (end - start)
    first = waiting.loc[waiting["time"] <= start + edge, "value"]
    last = waiting.loc[waiting["time"] >= end - edge, "value"]
    if len(waiting) < MIN_WINDOW_SCRAPES or first.empty or last.empty:
        return None
    trend = np.polyfit(waiting["time"] - start, waiting["value"], 1)[0]
    return bool(trend > 0 and last.mean() - first.mean() >= max(QUEUE_GROWTH_MIN_REQUESTS, first.mean()))


PREFIX_CACHE_WARN_POINTS = 0.1  # a server hit rate this far from the workload's ideal gets a warning line


def prefix_cache_warning(summary: dict) -> str | None:
    """One line when the server's prefix-cache hit rate is 10 points or more away from the rate the workload's
    prompts give an unbounded cache (``workload_ideal_hit_rate``; a summary without it: 0); None otherwise.
    Above it the cache was warm: every run of a sweep or search sends the same prompts, so a server whose cache
    was not reset between runs skips most prefills from its second run on. Below it the server cached less
    than the workload reuses: its cache is off, its blocks are larger than ``cache.block_size``, or it evicted."""
    rate = summary.get("server_prefix_cache_hit_rate")
    if rate is None:
        return None
    ideal = summary.get("workload_ideal_hit_rate") or 0.0
    if rate >= ideal + PREFIX_CACHE_WARN_POINTS:
        return (f"warning: the server served {rate:.0%} of the prompt tokens from its prefix cache, where the "
                f"workload's own reuse gives {ideal:.0%} (the runs of a sweep send the same prompts): its prefills "
                "are mostly skipped, so latencies and capacity are not like for like with an engine that computes "
                "them; start it without (vLLM: --no-enable-prefix-caching) or with POST /reset_prefix_cache "
                "(vLLM: VLLM_SERVER_DEV_MODE=1)")
    if rate <= ideal - PREFIX_CACHE_WARN_POINTS:
        return (f"warning: the server served {rate:.0%} of the prompt tokens from its prefix cache, where the "
                f"workload's prompts give an unbounded cache of cache.block_size-token blocks {ideal:.0%}: its "
                "cache is off, its blocks are larger (set cache.block_size to its block size) or it evicted them")
    return None


def series_summary(series: pd.DataFrame, window: tuple[float, float] | None) -> dict:
    """The summary's server figures of one run's series (all None where the series lacks the metric)."""
    queries = counter_increase(series, "prefix_cache_queries_total")
    hits = counter_increase(series, "prefix_cache_hits_total")
    return {
        "server_peak_running": _peak(series, "requests_running"),
        "server_peak_waiting": _peak(series, "requests_waiting"),
        "server_peak_kv_cache_usage": _peak(series, "kv_cache_usage"),
        "server_preemptions": counter_increase(series, "preemptions_total"),
        "server_prefix_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "server_peak_prefix_cache_blocks": _peak(series, "prefix_cache_blocks"),
        "server_prefix_cache_evictions": counter_increase(series, "prefix_cache_evictions_total"),
        "server_queue_growing": queue_growing(series, window),
    }
