"""What one Locust process records of its requests for the LLM tab, as they happen: each token as it
arrives (the first one's TTFT, every later one's gap), each request's end, late sends and the requests
in flight. ``drain`` hands the events over to loadgen.locust.llm_stats.LLMStats (locally, or through a
worker's stats report to the master) as plain lists. Plain Python, no Locust."""
from __future__ import annotations

import itertools
import math

from stallfree.engine.records import RequestRecord
from stallfree.loadgen.openai_client.completions import CANCELLED_AT_STOP


class LiveEvents:
    """The events of one process since the last ``drain``; times are epoch seconds, latencies ms."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._clear()

    def _clear(self) -> None:
        self.ttft: list[tuple[float, float]] = []  # (first token time, TTFT from the intended send)
        self.tbt: list[tuple[float, float]] = []  # (token time, gap to the previous token)
        # (time, outcome, TTFT, largest gap; NaN: none); outcome: 1 ok, 0 failed, -1 cancelled at stop
        self.ended: list[tuple[float, int, float, float]] = []
        self.late: list[float] = []

    def sent(self) -> None:
        self.in_flight += 1

    def tokens(self, record: RequestRecord, first_new: int) -> None:
        """The record's tokens from index ``first_new`` on have just arrived."""
        times = record.token_times
        for i in range(first_new, len(times)):
            if i == 0:
                self.ttft.append((times[0], (times[0] - record.intended_send_time) * 1e3))
            else:
                self.tbt.append((times[i], (times[i] - times[i - 1]) * 1e3))

    def ended_request(self, record: RequestRecord) -> None:
        """A request's record is final: sent ones leave the in-flight count, arrivals dropped unsent do not."""
        if record.send_time is not None:
            self.in_flight -= 1
        times = record.token_times if record.status == "ok" else []
        ttft_ms = (times[0] - record.intended_send_time) * 1e3 if times else math.nan
        max_gap_ms = max((b - a for a, b in itertools.pairwise(times)), default=math.nan) * 1e3
        outcome = 1 if record.status == "ok" else -1 if record.error == CANCELLED_AT_STOP else 0
        self.ended.append((record.finish_time or record.intended_send_time, outcome, ttft_ms, max_gap_ms))

    def late_send(self, time: float) -> None:
        self.late.append(time)

    def drain(self) -> dict:
        """The events since the last drain (and the current in-flight count), as msgpack-able lists."""
        events = {"ttft": self.ttft, "tbt": self.tbt, "ended": self.ended, "late": self.late,
                  "in_flight": self.in_flight}
        self._clear()
        return events
