"""The engine's clock, injected: wall time for real runs, a counter the simulated runner advances offline."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from stallfree.engine.registry import Registry


class Clock(Protocol):
    def __call__(self) -> float:
        """Now, in seconds."""
        ...

    def idle_until(self, t: float) -> None:
        """Nothing to run before ``t``: a virtual clock jumps there; wall time cannot (the caller waits)."""
        ...


CLOCKS: Registry[Callable[[], Clock]] = Registry("model.clock")  # the clock of a simulated runner


@CLOCKS.register("real")
class WallClock:
    def __call__(self) -> float:
        return time.time()

    def idle_until(self, t: float) -> None:
        pass


@CLOCKS.register("virtual")
class VirtualClock:
    def __init__(self, start: float = 0.0):
        self.time = start

    def __call__(self) -> float:
        return self.time

    def advance_to(self, t: float) -> None:
        self.time = max(self.time, t)

    idle_until = advance_to
