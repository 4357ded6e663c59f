"""Repeated runs of one point (``repeats=N``: the same settings on seeds seed, seed + 1, ...; they share
a ``point_id``): per metric the mean and its 95% interval (``stallfree.engine.records.repeat_stats.mean_interval``)."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from stallfree.analysis.load import disturbed_mask
from stallfree.engine.records.repeat_stats import mean_interval

METRICS = ("output_throughput", "request_throughput", "p99_tbt_ms", "median_ttft_ms", "p99_ttft_ms",
           "median_e2el_ms", "p99_e2el_ms")


def point_ids(runs: pd.DataFrame) -> pd.Series:
    """Each run's point: its ``point_id``, or its own run id when it has none (older runs, vLLM files)."""
    ids = runs["point_id"] if "point_id" in runs else pd.Series(None, index=runs.index, dtype=object)
    return ids.fillna(runs["experiment"].astype(str) + "/" + runs["run_id"].astype(str))


def repeat_summary(runs: pd.DataFrame, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """One row per point, in first-run order: the first run's other columns, ``n_repeats``, and for each
    metric its mean (under the metric's own name), ``<metric>_ci_lo`` and ``<metric>_ci_hi``.
    ``disturbed`` is true when any repeat was, and ``disturbed_runs`` names those runs."""
    if runs.empty:
        return runs.assign(n_repeats=pd.Series(dtype=int))
    rows = []
    for _, group in runs.assign(_point=point_ids(runs), _disturbed=disturbed_mask(runs)).groupby("_point", sort=False):
        row = group.iloc[0].to_dict()
        row.update(n_repeats=len(group), disturbed=bool(group["_disturbed"].any()),
                   disturbed_runs=list(group.loc[group["_disturbed"], "run_id"]))
        for metric in (m for m in metrics if m in group):
            interval = mean_interval(pd.to_numeric(group[metric], errors="coerce"))
            row.update({metric: interval.mean, f"{metric}_ci_lo": interval.lo, f"{metric}_ci_hi": interval.hi})
        rows.append(row)
    return pd.DataFrame(rows).drop(columns=["_point", "_disturbed"])
