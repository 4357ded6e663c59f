"""Throughput-latency Pareto frontiers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def pareto_front(runs: pd.DataFrame, latency: str = "p99_tbt_ms", throughput: str = "output_throughput",
                 by: Sequence[str] = ("scheduler",)) -> pd.DataFrame:
    """The non-dominated rows of `runs` per group `by` (all rows form one group when `by` is empty).

    A row is dominated when another row of its group has latency <= and throughput >=, one of them
    strictly. Rows with a missing latency or throughput are left out. Ties: rows with exactly equal
    (latency, throughput) do not dominate each other, so all of them are kept (no deduplication).
    The result keeps all columns, ordered by group then latency (then original order).
    """
    by = list(by)
    points = runs.dropna(subset=[latency, throughput])
    if points.empty:
        return points
    groups = [g for _, g in points.groupby(by, sort=False, dropna=False)] if by else [points]
    keep = pd.concat([_non_dominated(g[latency], g[throughput]) for g in groups])
    front = points[keep.reindex(points.index)]
    return front.sort_values([*by, latency], kind="stable")


def _non_dominated(latency: pd.Series, throughput: pd.Series) -> pd.Series:
    """Mask: best throughput at its latency and strictly above every row with a lower latency."""
    best_at = throughput.groupby(latency).transform("max")
    best_below = throughput.groupby(latency).max().sort_index().cummax().shift(1, fill_value=-np.inf)
    return (throughput == best_at) & (throughput > latency.map(best_below))
