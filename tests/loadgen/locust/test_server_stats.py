"""stallfree.loadgen.locust.server_stats: the LLM tab's MFU / MBU columns from successive /metrics scrapes."""
from __future__ import annotations

import time

import pytest

from stallfree.loadgen.locust.llm_stats import WHOLE_RUN, WINDOW_S
from stallfree.loadgen.locust.server_stats import ServerUtilisation, parse_utilisation

T0 = 1_700_000_000.0


def page(mfu_sum: float, mbu_sum: float, count: int) -> str:
    lines = []
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
    assert parse_utilisation(page(1.5, 0.5, 10)) == {"mfu_sum": 1.5, "mfu_count": 10, "mbu_sum": 0.5, "mbu_count": 10}
    assert parse_utilisation("# nothing here\n") == {}


def test_windows_are_increases_between_scrapes():
    fake = FakeMetricsEndpoint([page(1.0, 1.0, 10), page(3.0, 2.0, 20), None, page(7.0, 2.5, 40),
                                page(7.0, 2.5, 40)])
    util = ServerUtilisation("http://server:8000/", api_key="k", fetch=fake)
    util.reset(T0)
    for now in (T0 + 1, T0 + 2, T0 + 3, T0 + WINDOW_S + 1, T0 + WINDOW_S + 2):
        util.poll(now)
    assert fake.urls[0] == ("http://server:8000/metrics", {"Authorization": "Bearer k"})
    assert util.columns(window_name(0)) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(10.0)}
    assert util.columns(window_name(1)) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(2.5)}
    assert util.columns(WHOLE_RUN) == {"mfu_pct": pytest.approx(20.0), "mbu_pct": pytest.approx(5.0)}
    assert util.columns(window_name(5)) == {"mfu_pct": "", "mbu_pct": ""}
