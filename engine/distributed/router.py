"""The routers of data-parallel replicas (``parallel.router``), Vidur's global schedulers: which replica takes the
next request, given how many requests each has outstanding (sent, not finished)."""
from __future__ import annotations

from stallfree.engine.registry import Registry

ROUTERS: Registry[type] = Registry("parallel.router")


@ROUTERS.register("round_robin")
class RoundRobin:
    """Each replica in turn, whatever their load."""

    def __init__(self) -> None:
        self.turn = -1

    def pick(self, outstanding: list[int]) -> int:
        self.turn = (self.turn + 1) % len(outstanding)
        return self.turn


@ROUTERS.register("least_outstanding")
class LeastOutstanding:
    """The replica with the fewest outstanding requests; among equals, the one after the last picked."""

    def __init__(self) -> None:
        self.last = -1

    def pick(self, outstanding: list[int]) -> int:
        n = len(outstanding)
        order = [(self.last + 1 + k) % n for k in range(n)]
        self.last = min(order, key=lambda replica: outstanding[replica])
        return self.last
