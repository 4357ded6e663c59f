"""The server's side of the Locust LLM tab, from the target's /metrics read in loadgen's vocabulary
(loadgen.targets.server_vocabulary), whatever the engine: each window's peak of waiting requests and of
KV-cache usage, and, from stallfree's own server, the mean MFU and MBU of the engine's iterations (the
increase of its ``stallfree:iteration_mfu`` / ``_mbu`` histograms' _sum over the increase of their _count
between two scrapes). Plain Python, no Locust; the tab polls it."""
from __future__ import annotations

import http.client
import time
import urllib.request
from collections.abc import Callable

from stallfree.loadgen.locust.llm_stats import WHOLE_RUN, WINDOW_S
from stallfree.loadgen.targets.server_vocabulary import read_page

UTILISATION = ("mfu", "mbu")  # stallfree's iteration_<u>_sum / _count counters
PEAKS = ("requests_waiting", "kv_cache_usage")  # gauges: each window's highest scrape
COLUMNS = {"mfu_pct": "MFU %", "mbu_pct": "MBU %", "requests_waiting_peak": "waiting (server, peak)",
           "kv_cache_usage_peak_pct": "KV cache % (peak)"}


def parse_page(text: str) -> dict[str, float]:
    """A /metrics page's values in loadgen's vocabulary; {} for an engine it does not know."""
    return {sample.metric: sample.value for sample in read_page(text).samples}


def fetch_metrics(url: str, headers: dict[str, str], timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
        return response.read().decode()


class ServerUtilisation:
    """Per-window increases of the utilisation counters and peaks of the gauges, from successive scrapes
    (``poll``); a failed scrape is skipped."""

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
            sample = parse_page(self.fetch(self.url, self.headers))
        except (OSError, ValueError, http.client.HTTPException):  # a server cut off mid-page at the stop
            return
        if sample:
            begin = self.start + max(0, (now - self.start) // WINDOW_S) * WINDOW_S
            name = time.strftime("%H:%M:%S", time.localtime(begin))
            for window in (self.windows.setdefault(name, {}), self.windows.setdefault(WHOLE_RUN, {})):
                for key in (f"iteration_{u}_{part}" for u in UTILISATION for part in ("sum", "count")):
                    if self.last is not None and key in sample:
                        window[key] = window.get(key, 0.0) + sample[key] - self.last.get(key, 0.0)
                for key in PEAKS:
                    if key in sample:
                        window[f"{key}_peak"] = max(window.get(f"{key}_peak", 0.0), sample[key])
        self.last = sample or self.last

    def columns(self, window: str) -> dict[str, float | str]:
        """MFU %, MBU %, peak waiting requests and peak KV-cache % of a window (its name as in the LLM tab's
        rows; 3 significant digits); "" where the server did not say."""
        sums = self.windows.get(window, {})
        utilisation = {f"{u}_pct": _3g(100 * sums[f"iteration_{u}_sum"] / sums[f"iteration_{u}_count"])
                       if sums.get(f"iteration_{u}_count") else "" for u in UTILISATION}
        waiting, kv = sums.get("requests_waiting_peak"), sums.get("kv_cache_usage_peak")
        return {**utilisation, "requests_waiting_peak": "" if waiting is None else _3g(waiting),
                "kv_cache_usage_peak_pct": "" if kv is None else _3g(100 * kv)}


def _3g(value: float) -> float:
    return float(f"{value:.3g}")
