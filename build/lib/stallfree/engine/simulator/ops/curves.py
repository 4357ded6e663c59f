"""Measured operator time as a function of the token count, and its transfer to unprofiled shapes.

``TokenCurve``: one operator of one profiled shape, seconds at each profiled token count. A token
count between two profiled ones takes the time of the next one up: kernels work on tiles of rows, so
time is a step function of the rows, and the step a tile boundary makes stays a step (linear
interpolation would smear it over the gap between profiled counts). Beyond the largest profiled count the
rows are split into pieces of that size, whose times add.

``ShapeInterpolator``: an operator's time for a shape nobody profiled, from the profiled shapes nearest
to it. Shapes are points in log space of their dimensions (a GEMM's k and n; an elementwise op's width);
at each token count it takes the log of the time per unit of work (per weight of a GEMM, per element of
an elementwise op) of the ``neighbours`` nearest profiled shapes, weights them by inverse squared
distance, and scales back by the target's work. Time per weight at a fixed token count is the inverse of
the achieved efficiency up to a constant, so this interpolates an efficiency surface over shapes, at
every profiled token count separately: the tile steps the neighbours share survive.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenCurve:
    shape: tuple[int, ...]         # the operator's dimensions (k, n) or (width,)
    token_counts: tuple[int, ...]  # ascending
    seconds: tuple[float, ...]
    source: str = ""               # the profiled model it was measured on

    @classmethod
    def of(cls, shape: tuple[int, ...], points: dict[int, list[float]], source: str = "") -> TokenCurve:
        """From token count -> the measured times there (repeated measurements are averaged)."""
        counts = sorted(points)
        return cls(shape, tuple(counts), tuple(sum(points[m]) / len(points[m]) for m in counts), source)

    def at(self, num_tokens: int) -> float:
        top = self.token_counts[-1]
        if num_tokens > top:
            pieces, rest = divmod(num_tokens, top)
            return pieces * self.seconds[-1] + (self.at(rest) if rest else 0.0)
        return self.seconds[bisect.bisect_left(self.token_counts, num_tokens)]

    @property
    def work(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ShapeInterpolator:
    curves: tuple[TokenCurve, ...]
    neighbours: int = 4
    distance_floor: float = 0.05  # in log units: an exact shape match weighs (1/0.05)^2 = 400x a unit distance

    def __post_init__(self):
        if not self.curves:
            raise ValueError("ShapeInterpolator needs at least one profiled curve")

    def nearest(self, shape: tuple[int, ...]) -> list[tuple[float, TokenCurve]]:
        """(weight, curve) of the nearest profiled shapes, weights summing to 1."""
        scored = sorted((math.dist([math.log(x) for x in shape], [math.log(x) for x in c.shape]), i)
                        for i, c in enumerate(self.curves))[:self.neighbours]
        weights = [1.0 / (d + self.distance_floor) ** 2 for d, _ in scored]
        total = sum(weights)
        return [(w / total, self.curves[i]) for w, (_, i) in zip(weights, scored, strict=True)]

    def table(self, shape: tuple[int, ...], max_tokens: int) -> list[float]:
        """Seconds at 0..max_tokens tokens (0 tokens: 0 s)."""
        return [0.0, *self.table_at(shape, range(1, max_tokens + 1))]

    def table_at(self, shape: tuple[int, ...], token_counts) -> list[float]:
        near = self.nearest(shape)
        work = math.prod(shape)
        return [work * math.exp(sum(w * math.log(c.at(m) / c.work) for w, c in near)) for m in token_counts]
