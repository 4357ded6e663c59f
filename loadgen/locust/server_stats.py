"""The server's side of the Locust LLM tab: each window's mean MFU and MBU of the engine's iterations, from the
``stallfree:iteration_mfu`` / ``stallfree:iteration_mbu`` histograms on the target's /metrics (the increase of
_sum over the increase of _count between two scrapes). Plain Python, no Locust; the tab polls it."""
from __future__ import annotations

import http.client
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from stallfree.loadgen.locust.llm_stats import WHOLE_RUN, WINDOW_S

SERIES = {"mfu": "stallfree:iteration_mfu", "mbu": "stallfree:iteration_mbu"}
COLUMNS = {"mfu_pct": "MFU %", "mbu_pct": "MBU %"}


def parse_utilisation(text: str) -> dict[str, float]:
    """The _sum and _count of each series (summed over labels) in a /metrics page; {} without them."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, series in SERIES.items():
                for part in ("sum", "count"):
                    if sample.name == f"{series}_{part}":
                        out[f"{key}_{part}"] = out.get(f"{key}_{part}", 0.0) + sample.value
    return out


def fetch_metrics(url: str, headers: dict[str, str], timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
        return response.read().decode()


class ServerUtilisation:
    """Per-window increases of the series, from successive scrapes (``poll``); a failed scrape is skipped."""

    def __init__(self, host: str, api_key: str | None = None, fetch: Callable[[str, dict], str] = fetch_metrics):
        self.url = host.rstrip("/") + "/metrics"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.fetch = fetch
        self.reset(time.time())

    def reset(self, start: float) -> None:
        self.start, self.last = start, None
        self.windows: dict[str, dict[str, float]] = {}  # by window name (its start, HH:MM:SS), and WHOLE_RUN

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        try:
            sample = parse_utilisation(self.fetch(self.url, self.headers))
        except (OSError, ValueError, http.client.HTTPException):  # a server cut off mid-page at the stop
            return
        if self.last is not None and sample:
            begin = self.start + max(0, (now - self.start) // WINDOW_S) * WINDOW_S
            name = time.strftime("%H:%M:%S", time.localtime(begin))
            for window in (self.windows.setdefault(name, {}), self.windows.setdefault(WHOLE_RUN, {})):
                for key, value in sample.items():
                    window[key] = window.get(key, 0.0) + value - self.last.get(key, 0.0)
        self.last = sample or self.last

    def columns(self, window: str) -> dict[str, float | str]:
        """MFU % and MBU % of a window (its name as in the LLM tab's rows; 3 significant digits); "" without
        iterations."""
        sums = self.windows.get(window, {})
        return {f"{key}_pct": float(f"{100 * sums[f'{key}_sum'] / sums[f'{key}_count']:.3g}")
                if sums.get(f"{key}_count") else "" for key in SERIES}
