"""How a capacity is stated: exact when a passing and a failing rate bracket it, else a bound.

``exact``: the highest passing rate of a bracketed search; ``lower``: the highest rate tried passed, so the
capacity is at least it (``>= X``); ``upper``: no rate passed, so the capacity is below the lowest tried
(``< X``). A mean over repeats is ``exact`` when every repeat is, ``upper`` when every repeat is, and
otherwise ``lower`` (an unbracketed repeat counts as its highest passing rate, or 0: the mean can only be
higher).
"""
from __future__ import annotations

from collections.abc import Sequence

EXACT, LOWER, UPPER = "exact", "lower", "upper"


def search_bound(lo_qps: float | None, hi_qps: float | None) -> str:
    """The bound of one search from its highest passing and lowest failing rate (None: none)."""
    if lo_qps is None:
        return UPPER
    return EXACT if hi_qps is not None else LOWER


def mean_bound(bounds: Sequence[str]) -> str:
    """The bound of a mean over repeats (see the module docstring)."""
    return bounds[0] if len(set(bounds)) == 1 else LOWER


def capacity_text(capacity_qps: float, bound: str, lowest_tried: float | None = None, short: bool = False,
                  unit: str = "") -> str:
    """``3.2``; ``>= 128 (the highest rate tried)``; ``< 0.05 (the lowest rate tried)``: never a bound as a
    plain number. ``short``: without the parenthesis (a plot label); ``unit`` follows the number."""
    if bound == LOWER:
        return f">= {capacity_qps:.3g}{unit}" + ("" if short else " (the highest rate tried)")
    if bound == UPPER:
        if lowest_tried is None:
            return "below the lowest rate tried"
        return f"< {lowest_tried:.3g}{unit}" + ("" if short else " (the lowest rate tried)")
    return f"{capacity_qps:.3g}{unit}"
