"""engine.records.server_summary: peaks, counter increases, the prefix-cache hit rate and the growing
queue of a run's server series, on constructed series."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stallfree.engine.records.server_summary import counter_increase, queue_growing, series_summary

T0 = 1_700_000_000.0


def series(**metrics: list[float]) -> pd.DataFrame:
    """One scrape every 0.5 s from T0, each metric's values in order."""
    return pd.DataFrame([{"time": T0 + 0.5 * i, "metric": name, "value": value, "series": f"vllm:{name}"}
                         for name, values in metrics.items() for i, value in enumerate(values)])


def test_peaks_increases_and_hit_rate():
    s = series(requests_running=[1, 4, 2], requests_waiting=[0, 3, 1], kv_cache_usage=[0.1, 0.9, 0.4],
               preemptions_total=[5, 7, 7], prefix_cache_queries_total=[100, 300, 500],
               prefix_cache_hits_total=[10, 60, 110])
    out = series_summary(s, None)
    assert (out["server_peak_running"], out["server_peak_waiting"], out["server_peak_kv_cache_usage"]) == (4, 3, 0.9)
    assert out["server_preemptions"] == 2
    assert out["server_prefix_cache_hit_rate"] == pytest.approx(100 / 400)
    assert out["server_queue_growing"] is None  # no arrival window


def test_a_counter_reset_is_not_a_fall_and_missing_metrics_are_none():
    assert counter_increase(series(preemptions_total=[3, 5, 0, 2]), "preemptions_total") == 4
    assert counter_increase(series(preemptions_total=[3]), "preemptions_total") is None
    out = series_summary(series(requests_running=[1, 2]), (T0, T0 + 1))
    assert out["server_peak_waiting"] is None and out["server_preemptions"] is None
    assert out["server_prefix_cache_hit_rate"] is None  # no prefix cache (stallfree)
    idle = series_summary(series(prefix_cache_queries_total=[5, 5], prefix_cache_hits_total=[0, 0]), None)
    assert idle["server_prefix_cache_hit_rate"] is None  # nothing looked up: no rate to claim


WINDOW = (T0, T0 + 10.0)  # 21 scrapes


@pytest.mark.parametrize(("waiting", "growing"), [
    (np.linspace(0, 20, 21), True),  # a saturated server: the queue grows all along
    (np.r_[np.zeros(15), np.linspace(1, 8, 6)], True),  # saturating late
    (np.full(21, 30.0), False),  # long but steady
    (np.r_[np.linspace(0, 20, 11), np.linspace(18, 0, 10)], False),  # a burst that drained
    (np.r_[np.zeros(18), [1, 2, 3]], False),  # a few more: noise, not saturation
    (np.linspace(10, 15, 21), False),  # rising, but not doubled
])
def test_the_queue_grows_when_its_end_is_well_above_its_start_and_rising(waiting, growing):
    assert queue_growing(series(requests_waiting=list(waiting)), WINDOW) is growing


def test_queue_growth_needs_a_window_with_scrapes():
    s = series(requests_waiting=[0, 5, 10, 20])
    assert queue_growing(s, None) is None and queue_growing(s, (T0, T0)) is None
    assert queue_growing(s, (T0 + 100, T0 + 110)) is None  # no scrape in the window
    assert queue_growing(series(requests_running=[1, 2, 3, 4, 5]), WINDOW) is None  # no waiting series


def test_a_run_served_from_a_prefix_cache_gets_one_warning_line():
    from stallfree.engine.records.server_summary import prefix_cache_warning

    warning = prefix_cache_warning({"server_prefix_cache_hit_rate": 0.86})
    assert warning.startswith("warning: the server served 86% of the prompt tokens from its prefix cache")
    assert "--no-enable-prefix-caching" in warning
    assert prefix_cache_warning({"server_prefix_cache_hit_rate": 0.02}) is None
    assert prefix_cache_warning({"server_prefix_cache_hit_rate": None}) is None
    # the workload's own reuse is no warm cache; a cache that misses it is no cache
    assert prefix_cache_warning({"server_prefix_cache_hit_rate": 0.86, "workload_ideal_hit_rate": 0.84}) is None
    cold = prefix_cache_warning({"server_prefix_cache_hit_rate": 0.0, "workload_ideal_hit_rate": 0.6})
    assert cold.startswith("warning: the server served 0% of the prompt tokens") and "60%" in cold
    assert "cache is off" in cold
