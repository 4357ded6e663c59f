"""The server's own view of a run: its Prometheus ``/metrics`` page scraped from a thread every
``target.metrics_interval_s`` while the run replays (and once more at the end), read in our vocabulary
(loadgen.targets.server_vocabulary) into the rows of server_metrics.parquet.

A server without the page (an HTTP 4xx answer), whose page does not parse or has no series of a known
engine is not asked again; the run goes on, and ``reason`` says why it has no server metrics. A failed
connection or an HTTP 5xx is retried at the next tick.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import pandas as pd

from stallfree.engine.records.server_summary import series_summary
from stallfree.loadgen.results.run_dir import SERVER_METRICS_SCHEMA
from stallfree.loadgen.targets.server_vocabulary import ENGINES, read_page

TIMEOUT_S = 5.0


@dataclass
class ServerMetrics:
    """What the scrapes of one replay gave: ``engine`` (a key of ENGINES) and rows, or None and why not."""

    engine: str | None
    reason: str | None  # why there are no server metrics; None when there are
    scrapes: int  # pages read in our vocabulary
    rows: list[dict] = field(default_factory=list)  # time (epoch s), metric (ours), value, series (the raw name)

    def summary(self, window: tuple[float, float] | None) -> dict:
        """The run summary's server fields (engine.records.server_summary; ``window``: the arrival window)."""
        series = pd.DataFrame(self.rows, columns=SERVER_METRICS_SCHEMA.names)
        return {"server_metrics": self.engine, "server_metrics_reason": self.reason,
                "server_metrics_scrapes": self.scrapes, **series_summary(series, window)}


def not_scraped(reason: str) -> ServerMetrics:
    """The server metrics of a replay that scraped nothing (``reason``: why)."""
    return ServerMetrics(None, reason, 0)


class MetricsScraper:
    """``with MetricsScraper(url, interval_s) as scraper: ...``, then ``scraper.result``: ``{url}/metrics``
    scraped every ``interval_s`` from a thread while the block runs, and once more at its end
    (``interval_s`` None: never)."""

    def __init__(self, url: str, interval_s: float | None):
        self.url, self.interval_s = f"{url}/metrics", interval_s
        self.engine: str | None = None
        self.rows: list[dict] = []
        self.scrapes = 0
        self.result: ServerMetrics | None = None
        self._failure: str | None = None  # the last scrape's failure
        self._given_up = False
        self._stopping = threading.Event()

    def __enter__(self) -> MetricsScraper:
        if self.interval_s is not None:
            self._client = httpx.Client(timeout=TIMEOUT_S, trust_env=False)
            self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.result = self._stop() if self.interval_s is not None else not_scraped("target.metrics_interval_s is null")

    def _run(self) -> None:
        while not self._given_up:
            self._scrape()
            if self._stopping.wait(self.interval_s):
                return

    def _scrape(self) -> None:
        """Read the page once; record its samples, or why it gave none."""
        try:
            response = self._client.get(self.url)
        except httpx.HTTPError as e:
            self._failure = f"GET {self.url} failed ({type(e).__name__})"
            return
        now = time.time()
        if response.status_code >= 500:  # a busy or failing server: asked again at the next tick
            self._failure = f"GET {self.url} answered HTTP {response.status_code}"
            return
        if response.status_code >= 400:
            self._give_up(f"GET {self.url} answered HTTP {response.status_code}")
            return
        try:
            page = read_page(response.text)
        except ValueError as e:
            self._give_up(f"{self.url} is not in the Prometheus text format ({e})")
            return
        if page.engine is None:
            self._give_up(f"{self.url} has no series of a known engine ({', '.join(ENGINES)})")
            return
        self.engine, self.scrapes, self._failure = page.engine, self.scrapes + 1, None
        self.rows.extend({"time": now, "metric": s.metric, "value": s.value, "series": s.series}
                         for s in page.samples)

    def _give_up(self, reason: str) -> None:
        self._failure, self._given_up = reason, True

    def _stop(self) -> ServerMetrics:
        """Stop scraping, read the page a last time, and return what the scrapes gave."""
        self._stopping.set()
        self._thread.join()
        try:
            if not self._given_up:
                self._scrape()
        finally:
            self._client.close()
        if not self.scrapes:
            return not_scraped(self._failure or f"{self.url} gave no page")
        return ServerMetrics(self.engine, None, self.scrapes, self.rows)
