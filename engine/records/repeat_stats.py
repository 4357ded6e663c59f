"""Mean and 95% confidence interval of a metric over repeated runs (Student's t: a handful of repeats)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclass
class Interval:
    mean: float
    lo: float
    hi: float
    n: int


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and the t interval of the mean (NaNs dropped); with one value the interval is that value,
    with none everything is NaN."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return Interval(np.nan, np.nan, np.nan, 0)
    mean = float(v.mean())
    if len(v) == 1:
        return Interval(mean, mean, mean, 1)
    half = float(stats.t.ppf((1 + CONFIDENCE) / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return Interval(mean, mean - half, mean + half, len(v))
