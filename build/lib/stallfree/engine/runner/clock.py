"""The engine's clock, injected: wall time for real runs, a counter the simulated runner advances offline."""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Now, in seconds."""
        ...

    def idle_until(self, t: float) -> None:
        """Nothing to run before ``t``: a virtual clock jumps there; wall time cannot (the caller waits)."""
        ...


class WallClock:
    def __call__(self) -> float:
        return time.time()

    def idle_until(self, t: float) -> None:
        pass


class VirtualClock:
    def __init__(self, start: float = 0.0):
        self.time = start

    def __call__(self) -> float:
        return self.time

    def advance_to(self, t: float) -> None:
        self.time = max(self.time, t)

    idle_until = advance_to
