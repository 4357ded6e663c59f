"""stallfree.loadgen.locust.server_stats: the LLM tab's MFU / MBU and server queue columns from successive
/metrics scrapes, of stallfree's server or another engine's."""
from __future__ import annotations

import time

import pytest

from stallfree.loadgen.locust.llm_stats import WHOLE_RUN, WINDOW_S
from stallfree.loadgen.locust.server_stats import ServerUtilisation, parse_page

T0 = 1_700_000_000.0


def page(mfu_sum: float, mbu_sum: float, count: int, waiting: int = 0) -> str:
    lines = ["# TYPE vllm:num_requests_waiting gauge", f'vllm:num_requests_waiting{{model_name="tiny"}} {waiting}']
    for series, total in (("mfu", mfu_sum), ("mbu", mbu_sum)):
        name = f"stallfree:iteration_{series}"
        lines += [f"# HELP {name} x", f"# TYPE {name} histogram",
                  f'{name}_bucket{{le="+Inf",model_name="tiny"}} {count}',
                  f'{name}_count{{model_name="tiny"}} {count}', f'{name}_sum{{model_name="tiny"}} {total}']
    return "\n".join(lines) + "\n"


class FakeMetricsEndpoint:
    """Stands in for a server's /metrics (the scraping and windowing are under test, not the server)."""

    def __init__(self, pages: list[str | None]):
        self.pages, self.urls = pages, []

    def __call__(self, url: str, headers: dict) -> str:
        self.urls.append((url, headers))
        text = self.pages.pop(0)
        if text is None:
            raise OSError("connection refused")
        return text


def window_name(index: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(T0 + index * WINDOW_S))


def test_parse():
    assert parse_page(page(1.5, 0.5, 10, waiting=3)) == {
        "requests_waiting": 3, "iteration_mfu_sum": 1.5, "iteration_mfu_count": 10, "iteration_mbu_sum": 0.5,
        "iteration_mbu_count": 10}
    assert parse_page("# nothing here\n") == {}


def test_windows_are_increases_between_scrapes():
    fake = FakeMetricsEndpoint([page(1.0, 1.0, 10, waiting=1), page(3.0, 2.0, 20, waiting=5), None,
                                page(7.0, 2.5, 40, waiting=2), page(7.0, 2.5, 40)])
    util = ServerUtilisation("http://server:8000/", api_key="k", fetch=fake)
    util.reset(T0)
    for now in (T0 + 1, T0 + 2, T0 + 3, T0 + WINDOW_S + 1, T0 + WINDOW_S + 2):
        util.poll(now)
    assert fake.urls[0] == ("http://server:8000/metrics", {"Authorization": "Bearer k"})
    none = {"kv_cache_usage_peak_pct": ""}  # the page has no KV-cache series
    assert util.columns(window_name(0)) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(10.0),
                                            "requests_waiting_peak": 5, **none}
    assert util.columns(window_name(1)) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(2.5),
                                            "requests_waiting_peak": 2, **none}
    assert util.columns(WHOLE_RUN) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(5.0),
                                       "requests_waiting_peak": 5, **none}
    assert util.columns(window_name(5)) == {"mfu_pct": "", "mbu_pct": "", "requests_waiting_peak": "", **none}


def test_another_engines_queue_and_kv_usage():
    """vLLM's page has no MFU / MBU: those columns stay empty, the queue and KV-cache peaks are shown."""
    pages = [f'vllm:num_requests_waiting{{engine="0"}} {w}\nvllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
             for w, kv in ((4, 0.5), (9, 0.75), (1, 0.25))]
    util = ServerUtilisation("http://server:8000", fetch=FakeMetricsEndpoint(pages))
    util.reset(T0)
    for now in (T0 + 1, T0 + 2, T0 + 3):
        util.poll(now)
    assert util.columns(window_name(0)) == {"mfu_pct": "", "mbu_pct": "", "requests_waiting_peak": 9,
                                            "kv_cache_usage_peak_pct": 75}
