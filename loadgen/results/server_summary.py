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


PREFIX_CACHE_WARN_RATE = 0.1  # a run above it measured a prefix cache's hits, not its prefills


def prefix_cache_warning(summary: dict) -> str | None:
    """One line when the server served a share of the prompt tokens from its prefix cache; None otherwise.
    The workload's prompts come from its seed, so every run of a sweep or search sends the same ones and a
    server whose cache was not reset between runs skips most prefills from its second run on: not like for
    like with an engine that computes them."""
    rate = summary.get("server_prefix_cache_hit_rate")
    if rate is None or rate < PREFIX_CACHE_WARN_RATE or summary.get("prefix_cache_reset") == "reset":
        return None  # a cache emptied before the run holds only the reuse within it, the workload's own
    return (f"warning: the server served {rate:.0%} of the prompt tokens from its prefix cache (the runs of a "
            "sweep send the same prompts): its prefills are mostly skipped, so latencies and capacity are not "
            "like for like with an engine that computes them; start it without (vLLM: --no-enable-prefix-caching) "
            "or with POST /reset_prefix_cache (vLLM: VLLM_SERVER_DEV_MODE=1)")


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
