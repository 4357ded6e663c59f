"""The engine's clock, injected: wall time for real runs, a counter the simulated runner advances offline."""
from __future__ import annotations

import math
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

    def on_grid(self, t: float) -> float:
        """``t`` as this clock keeps time (a time or a duration): a virtual clock's tick, wall time as it is."""
        ...


CLOCKS: Registry[Callable[[], Clock]] = Registry("model.clock")  # the clock of a simulated runner


@CLOCKS.register("real")
class WallClock:
    def __call__(self) -> float:
        return time.time()

    def idle_until(self, t: float) -> None:
        pass

    def on_grid(self, t: float) -> float:
        return t


# Virtual times are multiples of this (~0.93 ns), so below 2**22 s (48 days) they add and subtract exactly: a
# run's results do not depend on where the clock stood when it began (a reused engine's next run starts
# later). In floats an iteration that ends just as a request arrives admitted it or not by the last bits of
# that start, and the whole schedule after it followed.
TICK_S = 2.0 ** -30


@CLOCKS.register("virtual")
class VirtualClock:
    def __init__(self, start: float = 0.0):
        self.time = self.on_grid(start)

    def __call__(self) -> float:
        return self.time

    @staticmethod
    def on_grid(t: float) -> float:
        """``t`` rounded up to a tick (exact: dividing and multiplying by a power of two). Up, never down: a
        clock sent to an arrival off the grid must not stop short of it."""
        return math.ceil(t / TICK_S) * TICK_S

    def advance_to(self, t: float) -> None:
        self.time = max(self.time, self.on_grid(t))

    def advance_by(self, seconds: float) -> None:
        self.time += self.on_grid(seconds)

    idle_until = advance_to
