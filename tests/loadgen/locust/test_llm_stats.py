"""The LLM tab's statistics without Locust: loadgen.locust.llm_events (what a process records) and
loadgen.locust.llm_stats (the aggregation), on hand-built records and events."""
from __future__ import annotations

from argparse import Namespace

import numpy as np
import pytest

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.locust.llm_events import LiveEvents
from stallfree.loadgen.locust.llm_stats import (
    WHOLE_RUN,
    WINDOW_S,
    LLMStats,
    LogHistogram,
    SLOBounds,
    slo_bounds,
)

T0 = 1_700_000_000.0


def ms(value: float):
    return pytest.approx(value, abs=1e-3)  # epoch seconds hold microseconds


def record(request_id: str, token_times: list[float], status: str = "ok", sent: bool = True) -> RequestRecord:
    spec = RequestSpec(request_id=request_id, prompt_token_ids=[1, 2, 3], max_tokens=len(token_times) or 1,
                       send_offset_s=0.0)
    r = RequestRecord.unsent(spec, intended_send_time=T0, is_warmup=False)
    if sent:
        r.mark_sent(T0)
        r.token_times = list(token_times)
        r.end(status, None if status == "ok" else "boom", (token_times or [T0])[-1] + 0.001)
    return r


def test_log_histogram_percentiles_are_nearest_rank_within_a_bin():
    values = np.random.default_rng(0).lognormal(mean=3, sigma=1.5, size=5000)
    histogram = LogHistogram()
    histogram.add(values[:2000])
    histogram.add(values[2000:])
    for q in (1, 50, 90, 99, 100):
        exact = np.percentile(values, q, method="inverted_cdf")
        assert histogram.percentile(q) == pytest.approx(exact, rel=0.011), q
    zeros = LogHistogram()
    zeros.add(np.array([0.0, 0.0, 5.0]))  # tokens of one chunk arrive together: gaps of 0
    assert zeros.percentile(50) == 0.0 and zeros.percentile(100) == pytest.approx(5.0, rel=0.011)
    assert LogHistogram().percentile(50) is None


def test_live_events_record_tokens_ends_and_the_in_flight_count():
    live = LiveEvents()
    r = RequestRecord.unsent(RequestSpec("a", 0.0, [1], 3), intended_send_time=T0, is_warmup=False)
    r.mark_sent(T0 + 0.01)
    live.sent()
    r.token_times += [T0 + 0.1]
    live.tokens(r, 0)
    r.token_times += [T0 + 0.15, T0 + 0.15]  # two tokens in one chunk
    live.tokens(r, 1)
    assert live.in_flight == 1
    r.end("ok", None, T0 + 0.2)
    live.ended_request(r)
    live.ended_request(record("dropped", [], sent=False))  # dropped unsent: it was never in flight
    events = live.drain()
    assert events["ttft"] == [(T0 + 0.1, ms(100.0))]
    assert [gap for _, gap in events["tbt"]] == [ms(50.0), 0.0]
    (t, ok, ttft, max_gap), (_, dropped_ok, dropped_ttft, _) = events["ended"]
    assert (t, ok, ttft, max_gap) == (T0 + 0.2, 1, ms(100.0), ms(50.0))
    assert dropped_ok == 0 and np.isnan(dropped_ttft)
    assert events["in_flight"] == 0
    assert live.drain() == {"ttft": [], "tbt": [], "ended": [], "late": [], "in_flight": 0}


def events_of(*records: RequestRecord, late: tuple[float, ...] = (), in_flight: int = 0) -> dict:
    live = LiveEvents()
    for r in records:
        live.tokens(r, 0)
        live.ended_request(r)
    for t in late:
        live.late_send(t)
    return {**live.drain(), "in_flight": in_flight}


def test_windows_rates_percentiles_and_slo():
    stats = LLMStats(SLOBounds(tbt_ms=30.0, ttft_ms=200.0))
    stats.reset(T0)
    fast = [T0 + 0.1 + 0.02 * i for i in range(10)]  # TTFT 100 ms, gaps 20 ms: meets the SLO
    gappy = [T0 + 0.1, T0 + 0.15, T0 + 0.2]  # a 50 ms gap
    slow_first = [T0 + 0.3, T0 + 0.31]  # TTFT 300 ms
    late_window = [T0 + WINDOW_S + 1.0, T0 + WINDOW_S + 1.01]  # TTFT 11 s, in the second window
    stats.ingest("w0", events_of(record("a", fast), record("b", gappy), late=(T0 + 1,), in_flight=2))
    stats.ingest("w1", events_of(record("c", slow_first), record("d", [T0 + 0.15]), record("e", [], "error"),
                                 record("f", late_window), in_flight=3))
    first, second, run = stats.rows()
    assert run["name"] == WHOLE_RUN and run["in_flight"] == 5 and second["in_flight"] == 5
    assert (first["ended"], second["ended"], run["ended"]) == (5, 1, 6)
    assert (first["output_tokens"], second["output_tokens"], run["output_tokens"]) == (16, 2, 18)
    assert first["output_tokens_per_s"] == pytest.approx(16 / WINDOW_S, abs=0.05)
    # the window still filling counts up to the last event (1.011 s into it)
    assert second["output_tokens_per_s"] == pytest.approx(2 / 1.011, abs=0.05)
    assert run["output_tokens_per_s"] == pytest.approx(18 / (WINDOW_S + 1.011), abs=0.05)
    # met: a (both bounds) and d (one token: no gaps); not b (gap), c (TTFT), e (error), f (TTFT)
    assert first["slo_met_pct"] == pytest.approx(40.0) and run["slo_met_pct"] == pytest.approx(100 * 2 / 6, abs=0.05)
    assert first["late"] == 1 and second["late"] == 0
    assert first["ttft_p50_ms"] == pytest.approx(100.0, rel=0.011)
    assert first["tbt_p99_ms"] == pytest.approx(50.0, rel=0.011) and second["tbt_p50_ms"] == pytest.approx(10.0, rel=0.011)
    assert [row["name"] for row in stats.rows(shown=1)] == [second["name"], WHOLE_RUN]
    lines = stats.csv_text().splitlines()
    assert lines[0].startswith("name,in_flight,ended,") and len(lines) == 4


def test_no_slo_counts_ok_requests_and_reset_starts_over():
    stats = LLMStats(SLOBounds())
    stats.reset(T0)
    stats.ingest("local", events_of(record("a", [T0 + 0.1, T0 + 5.0]), record("b", [], "timeout")))
    (window, run) = stats.rows()
    assert run["slo_met_pct"] == 50.0 and window["tbt_p50_ms"] == pytest.approx(4900.0, rel=0.011)
    stats.reset(T0 + 100)
    (empty_run,) = stats.rows()
    assert empty_run["ended"] == 0 and empty_run["slo_met_pct"] == "" and empty_run["ttft_p50_ms"] == ""


def options(**kw) -> Namespace:
    return Namespace(**{"slo": "", "slo_tbt_ms": 0.0, "slo_ttft_ms": 0.0, "decode_iter_ms": 0.0, **kw})


def test_slo_bounds_from_conf_slo_and_options():
    assert slo_bounds(options()) == SLOBounds()
    assert slo_bounds(options(slo_tbt_ms=200, slo_ttft_ms=900)) == SLOBounds(200.0, 900.0)
    assert slo_bounds(options(slo="strict", decode_iter_ms=20)) == SLOBounds(tbt_ms=100.0)  # 5 x
    assert slo_bounds(options(slo="relaxed", decode_iter_ms=20)) == SLOBounds(tbt_ms=500.0)  # 25 x
    assert slo_bounds(options(slo="strict", slo_tbt_ms=70)) == SLOBounds(tbt_ms=70.0)
    with pytest.raises(ValueError, match="--slo strict bounds TBT at 5x .* give --decode-iter-ms"):
        slo_bounds(options(slo="strict"))
    with pytest.raises(ValueError, match="--slo-tbt-ms must be >= 0"):
        slo_bounds(options(slo_tbt_ms=-5))
