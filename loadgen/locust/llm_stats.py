"""The token-level statistics of a Locust run, live, for the web UI's LLM tab (loadgen/locust/llm_tab.py):
output tokens/s, TTFT and TBT percentiles, SLO attainment, requests in flight and late sends, per
WINDOW_S window of the run and for the whole run. Plain Python, no Locust: it aggregates the event
batches of loadgen.locust.llm_events.LiveEvents.drain, from this process or from workers.

Latencies follow engine.records.request_metrics: TTFT from the intended send time, TBT every gap between two tokens. A
request meets the SLO as in its ``summarize`` (request_goodput): it is ok, its TTFT <= the TTFT bound and
every gap <= the TBT bound (each when given). Percentiles come from 2 %-wide logarithmic bins.
"""
from __future__ import annotations

import csv
import io
import math
import time
from argparse import Namespace
from dataclasses import dataclass, field

import numpy as np

from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.config.schema import SloGroup, load_group

WINDOW_S = 10.0
SHOWN_WINDOWS = 12  # the tab shows the latest windows; the CSV has them all
SLO_NAMES = sorted(p.stem for p in (CONF_DIR / "slo").glob("*.yaml"))
WHOLE_RUN = "whole run"  # its row name sorts after the windows' HH:MM:SS in the UI's table
MIN_MS, GROWTH, BINS = 1e-3, 1.02, 1200  # bin 0: below MIN_MS (shown as 0); the last bin: above ~20 min


@dataclass(frozen=True)
class SLOBounds:
    tbt_ms: float | None = None
    ttft_ms: float | None = None


def slo_bounds(opts: Namespace) -> SLOBounds:
    """The SLO of --slo (conf/slo/<name>.yaml, bounded as a bench run's: SloGroup.tbt_bound_ms of
    --decode-iter-ms; ttft_ms), where --slo-tbt-ms / --slo-ttft-ms override it. Raises ValueError on a negative value, or when the
    TBT bound needs the decode iteration time and --decode-iter-ms is not given."""
    for option in ("slo_tbt_ms", "slo_ttft_ms", "decode_iter_ms"):
        if getattr(opts, option) < 0:
            raise ValueError(f"--{option.replace('_', '-')} must be >= 0 (0: not given), got {getattr(opts, option):g}")
    tbt_ms, ttft_ms = opts.slo_tbt_ms or None, opts.slo_ttft_ms or None
    if opts.slo:
        slo = load_group("slo", opts.slo, SloGroup)
        ttft_ms = ttft_ms or slo.ttft_ms
        if tbt_ms is None and (tbt_ms := slo.tbt_bound_ms(opts.decode_iter_ms or None)) is None:
            raise ValueError(f"--slo {opts.slo} bounds TBT at {slo.tbt_multiple:g}x the decode iteration "
                             "time: give --decode-iter-ms (decode_iter_ms of a bench run's summary.json) "
                             "or --slo-tbt-ms")
    return SLOBounds(tbt_ms=tbt_ms, ttft_ms=ttft_ms)


def slo_label(slo: SLOBounds) -> str:
    """What ``slo_met_pct`` counts, in words: "SLO met % (TBT ≤ 50 ms)", or "ok % (no SLO given)"."""
    bounds = [f"{name} ≤ {value:g} ms" for name, value in (("TBT", slo.tbt_ms), ("TTFT", slo.ttft_ms))
              if value is not None]
    return f"SLO met % ({', '.join(bounds)})" if bounds else "ok % (no SLO given)"


class LogHistogram:
    """Counts of millisecond values in logarithmic bins GROWTH apart."""

    def __init__(self) -> None:
        self.counts = np.zeros(BINS, dtype=np.int64)

    def add(self, values_ms: np.ndarray) -> None:
        scaled = np.log(np.maximum(values_ms, MIN_MS) / MIN_MS) / math.log(GROWTH)
        bins = np.where(values_ms < MIN_MS, 0, np.minimum(1 + scaled.astype(np.int64), BINS - 1))
        self.counts += np.bincount(bins, minlength=BINS)

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (nearest rank) as its bin's midpoint; None when empty."""
        total = int(self.counts.sum())
        if not total:
            return None
        b = int(np.searchsorted(np.cumsum(self.counts), math.ceil(q / 100 * total)))
        return 0.0 if b == 0 else MIN_MS * GROWTH ** (b - 0.5)


@dataclass
class Summary:
    """The statistics of one window, or of the whole run."""

    ttft: LogHistogram = field(default_factory=LogHistogram)
    tbt: LogHistogram = field(default_factory=LogHistogram)
    output_tokens: int = 0
    ended: int = 0  # requests that ended, ok or failed: Locust's request count
    failed: int = 0  # Locust's failure count
    cancelled_at_stop: int = 0  # in flight when the test stopped: no Locust request, no failure
    slo_met: int = 0
    late: int = 0
    in_flight: int = 0  # the latest count seen

    def row(self, name: str, seconds: float) -> dict:
        def ms(histogram: LogHistogram, q: float) -> float | str:
            value = histogram.percentile(q)
            return "" if value is None else round(value, 1)

        per_s = 1 / max(seconds, 1e-3)
        return {"name": name, "in_flight": self.in_flight, "ended": self.ended, "failed": self.failed,
                "cancelled_at_stop": self.cancelled_at_stop, "requests_per_s": round(self.ended * per_s, 2),
                "output_tokens": self.output_tokens,
                "output_tokens_per_s": round(self.output_tokens * per_s, 1),
                "ttft_p50_ms": ms(self.ttft, 50), "ttft_p90_ms": ms(self.ttft, 90), "ttft_p99_ms": ms(self.ttft, 99),
                "tbt_p50_ms": ms(self.tbt, 50), "tbt_p90_ms": ms(self.tbt, 90), "tbt_p99_ms": ms(self.tbt, 99),
                "slo_met_pct": round(100 * self.slo_met / self.ended, 1) if self.ended else "",
                "late": self.late}


class LLMStats:
    """The run's statistics, from the event batches of every process (``ingest``)."""

    def __init__(self, slo: SLOBounds) -> None:
        self.slo = slo
        self.reset(time.time())

    def reset(self, start: float) -> None:
        """A new test (or Locust's Reset Stats): windows count from ``start``."""
        self.start, self.last_event = start, start
        self.windows: dict[int, Summary] = {}
        self.run = Summary()
        self.in_flight: dict[str, int] = {}  # by source (worker id): each one's latest count

    def _summaries(self, times: np.ndarray) -> list[tuple[Summary, np.ndarray]]:
        """(the window's summary, the mask of its events) for every window of the events at ``times``."""
        index = np.maximum(0, (times - self.start) // WINDOW_S).astype(np.int64)
        return [(self.windows.setdefault(int(w), Summary()), index == w) for w in np.unique(index)]

    def ingest(self, source: str, events: dict) -> None:
        """One drained batch of LiveEvents from ``source``."""
        ttft, tbt = np.array(events["ttft"], float).reshape(-1, 2), np.array(events["tbt"], float).reshape(-1, 2)
        ended, late = np.array(events["ended"], float).reshape(-1, 4), np.array(events["late"], float)
        for values, histogram in ((ttft, "ttft"), (tbt, "tbt")):
            getattr(self.run, histogram).add(values[:, 1])
            for summary, mask in self._summaries(values[:, 0]):
                getattr(summary, histogram).add(values[mask, 1])
                summary.output_tokens += int(mask.sum())
        self.run.output_tokens += len(ttft) + len(tbt)
        met = self._meets_slo(ended)
        for summary, mask in [(self.run, np.ones(len(ended), bool)), *self._summaries(ended[:, 0])]:
            outcome = ended[mask, 1]
            summary.ended += int((outcome >= 0).sum())
            summary.failed += int((outcome == 0).sum())
            summary.cancelled_at_stop += int((outcome < 0).sum())
            summary.slo_met += int(met[mask].sum())
        for summary, mask in [(self.run, np.ones(len(late), bool)), *self._summaries(late)]:
            summary.late += int(mask.sum())
        times = np.concatenate([ttft[:, 0], tbt[:, 0], ended[:, 0], late])
        self.last_event = max(self.last_event, float(times.max(initial=self.last_event)))
        self.in_flight[source] = events["in_flight"]
        self.run.in_flight = sum(self.in_flight.values())
        (latest, _), = self._summaries(np.array([self.last_event]))
        latest.in_flight = self.run.in_flight

    def _meets_slo(self, ended: np.ndarray) -> np.ndarray:
        """Rows (time, ok, ttft_ms, max_tbt_ms; NaN where undefined) -> whether each request met the SLO."""
        met = ended[:, 1] == 1
        if self.slo.ttft_ms is not None:
            met &= ended[:, 2] <= self.slo.ttft_ms
        if self.slo.tbt_ms is not None:
            met &= np.nan_to_num(ended[:, 3]) <= self.slo.tbt_ms  # a 1-token request has no gaps
        return met

    def rows(self, shown: int | None = SHOWN_WINDOWS) -> list[dict]:
        """One row per window with events (the latest ``shown``; None: all), then the whole run. Rates
        count up to the last event received, so a window still filling reads at its current rate."""
        windows = sorted(self.windows)
        rows = []
        for w in windows[-shown:] if shown else windows:
            begin = self.start + w * WINDOW_S
            name = time.strftime("%H:%M:%S", time.localtime(begin))
            rows.append(self.windows[w].row(name, min(WINDOW_S, self.last_event - begin)))
        return [*rows, self.whole_run()]

    def whole_run(self) -> dict:
        return self.run.row(WHOLE_RUN, self.last_event - self.start)

    def csv_text(self) -> str:
        """Every window and the whole run as CSV (the first column: the window's start time)."""
        rows = self.rows(shown=None)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
