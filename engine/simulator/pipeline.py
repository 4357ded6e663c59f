"""Pipeline-parallel timing: micro-batches flow through PP stages in order, several in flight at once.

A micro-batch enters stage 0 when it is scheduled and stage 0 is free; it enters stage i + 1 when it
has left stage i, its activations have been sent (``send_s``), stage i + 1 has finished the micro-batch
before it, and then stage i + 1 has taken it (``handoff_s``: the real pipeline's take of the ticket and
receive of the activations, which cost time even when the activations were sent long before). Each stage records, per micro-batch, its busy time and the idle time it spent waiting before
it (a bubble): the gap since it finished its previous micro-batch, counted from the start of the current
busy period. A busy period starts when work arrives at an engine that had none (``idle_until``), so time
with no requests at all is not a bubble, while a stage waiting on a slower neighbour, or on a scheduler
that had nothing left to batch because every runnable request was already in flight, is.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatchTiming:
    scheduled_s: float
    stage_start_s: tuple[float, ...]
    stage_end_s: tuple[float, ...]
    stage_idle_s: tuple[float, ...]  # the bubble each stage had right before this micro-batch
    stage_handoff_s: tuple[float, ...]  # the part of that bubble spent taking the micro-batch, once both were ready

    @property
    def end_s(self) -> float:
        """When the micro-batch leaves the last stage: its tokens are sampled then."""
        return self.stage_end_s[-1]

    @property
    def stage_busy_s(self) -> tuple[float, ...]:
        return tuple(end - start for start, end in zip(self.stage_start_s, self.stage_end_s, strict=True))


class Pipeline:
    def __init__(self, num_stages: int):
        if num_stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got {num_stages}")
        self.stage_free_s = [0.0] * num_stages
        self.period_start_s = 0.0

    @property
    def num_stages(self) -> int:
        return len(self.stage_free_s)

    def idle_until(self, t: float) -> None:
        """The engine had no work until ``t``: a new busy period starts there."""
        self.period_start_s = max(self.period_start_s, t)

    def submit(self, now: float, stage_s: Sequence[float], send_s: float,
               handoff_s: Sequence[float] | None = None) -> MicroBatchTiming:
        """Time a micro-batch scheduled at ``now`` whose stages take ``stage_s`` seconds each, and
        ``handoff_s`` each to take it once it is ready and they are free (none by default)."""
        handoff_s = handoff_s or [0.0] * self.num_stages
        for times, what in ((stage_s, "stage"), (handoff_s, "hand-off")):
            if len(times) != self.num_stages:
                raise ValueError(f"{len(times)} {what} times for a {self.num_stages}-stage pipeline")
        starts, ends, idles = [], [], []
        ready = now
        for stage, (seconds, handoff) in enumerate(zip(stage_s, handoff_s, strict=True)):
            free = self.stage_free_s[stage]
            start = max(free, ready) + handoff
            idles.append(start - max(free, self.period_start_s))
            starts.append(start)
            ends.append(start + seconds)
            self.stage_free_s[stage] = start + seconds
            ready = start + seconds + send_s
        return MicroBatchTiming(now, tuple(starts), tuple(ends), tuple(idles), tuple(handoff_s))
