"""Capacity: the highest QPS meeting a TBT SLO, per policy, chunk size and SLO.

A run *passes* an SLO when `p99_tbt_ms <= slo_tbt_ms`, `median_scheduling_delay_ms <=
max_scheduling_delay_ms` (2 s by default) and `completion_ratio >= MIN_COMPLETION_RATIO` (the server kept
pace; a run without one of these fields is not held back by it). Capacity is the highest passing QPS of a
config, stated with its bound (`capacity_bound`, engine.records.capacity_bound): `exact` when a higher QPS
failed, `lower` when the highest QPS tried passed (shown `>= X`), `upper` when none passed (capacity 0.0,
shown `< the lowest QPS tried`); `capacity_display` is the text every table and plot shows.

Sources, per experiment, the first that exists wins:

1. `results/<exp>/capacity.json`, written by a capacity search: a JSON list of
   `{"scheduler": str, "chunk_size": int | null, "slo_name": str, "slo_tbt_ms": float,
   "capacity_qps": float, "capacity_bound": str, "points": [...]}` (a record without `capacity_bound`
   takes it from `bracketed`, `lo_qps` and `hi_qps`).
2. Probe runs of a capacity search: runs whose summary has a `capacity_search` field (the SLO name);
   each is checked against its own `slo_tbt_ms`.
3. A plain sweep: every run is checked against every SLO of `slos`.

Strict / relaxed SLOs default to 5x / 25x the measured decode-only iteration time (`slo_levels`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from stallfree.analysis.load import label_configs
from stallfree.engine.records.capacity_bound import EXACT, LOWER, UPPER, capacity_text, search_bound

BASELINE = "vllm"
STRICT_FACTOR = 5.0
RELAXED_FACTOR = 25.0
MAX_SCHEDULING_DELAY_MS = 2000.0
MIN_COMPLETION_RATIO = 0.9  # conf/bench.yaml capacity.min_completion_ratio
CONFIG_KEYS = ["experiment", "scheduler", "chunk_size", "chunk", "config"]
SLO_KEYS = ["slo_name", "slo_tbt_ms", "source"]
COLUMNS = [*CONFIG_KEYS, *SLO_KEYS, "capacity_qps", "capacity_bound", "capacity_display", "capacity_ci_lo",
           "capacity_ci_hi", "ratio_to_vllm"]


def slo_levels(runs: pd.DataFrame, batches: pd.DataFrame | None = None, strict_ms: float | None = None,
               relaxed_ms: float | None = None) -> dict[str, float]:
    """TBT SLOs in ms by name, strictest first.

    Explicit `strict_ms` / `relaxed_ms` win; a missing one is 5x / 25x the decode iteration time:
    the median of the runs' `decode_iter_ms` (what stallfree-bench based its relative SLOs on), else
    the median decode-only iteration of `batches`. Without any, the runs' configured `slo_tbt_ms` is
    used, named "configured" ("configured <v> ms" when runs differ). Empty when nothing defines one.
    """
    decode_ms = runs["decode_iter_ms"].median() if "decode_iter_ms" in runs else float("nan")
    if pd.isna(decode_ms) and batches is not None and not batches.empty:
        decode_ms = batches.loc[batches["kind"] == "decode", "iteration_ms"].median()
    levels = {"strict": strict_ms if strict_ms is not None else STRICT_FACTOR * decode_ms,
              "relaxed": relaxed_ms if relaxed_ms is not None else RELAXED_FACTOR * decode_ms}
    levels = {name: float(v) for name, v in levels.items() if pd.notna(v)}
    configured = sorted(runs["slo_tbt_ms"].dropna().unique()) if "slo_tbt_ms" in runs else []
    if not levels and configured:
        levels = {f"configured {v:g} ms" if len(configured) > 1 else "configured": float(v)
                  for v in configured}
    return dict(sorted(levels.items(), key=lambda kv: kv[1]))


def with_bound(record: dict) -> dict:
    """A capacity.json record with its bound and display text. Records of earlier versions lack the bound: it
    follows from ``bracketed`` / ``lo_qps`` / ``hi_qps``, or, for a bare capacity, is taken as exact."""
    bound = record.get("capacity_bound") or (
        search_bound(record.get("lo_qps"), record.get("hi_qps")) if "bracketed" in record else EXACT)
    lowest = min((p["qps"] for p in record.get("points", [])), default=record.get("hi_qps"))
    return {**record, "capacity_bound": bound,
            "capacity_display": capacity_text(record["capacity_qps"], bound, lowest)}


def load_capacity_json(path: str | Path) -> pd.DataFrame:
    """Rows of every `capacity.json` at `path` or in its experiment subdirs, labelled like runs."""
    path = Path(path)
    rows = [with_bound({"experiment": f.parent.name, **row, "source": "capacity.json"})
            for pattern in ("capacity.json", "*/capacity.json") for f in sorted(path.glob(pattern))
            for row in json.loads(f.read_text())]
    if not rows:
        return pd.DataFrame(columns=COLUMNS[:-1])
    return label_configs(pd.DataFrame(rows)).reindex(columns=COLUMNS[:-1])


def capacity_from_runs(runs: pd.DataFrame, slos: Mapping[str, float],
                       max_scheduling_delay_ms: float = MAX_SCHEDULING_DELAY_MS) -> pd.DataFrame:
    """Capacity per config and SLO from runs: search probes (source 2) and sweep runs (source 3)."""
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS[:-1])
    search = runs.get("capacity_search", pd.Series(None, index=runs.index, dtype=object))
    is_probe = search.notna()
    probes = runs[is_probe].assign(slo_name=search[is_probe].astype(str), source="capacity search")
    levels = pd.DataFrame({"slo_name": list(slos), "slo_tbt_ms": list(slos.values()), "source": "sweep"})
    sweep = runs[~is_probe].drop(columns=["slo_tbt_ms", "slo_name"], errors="ignore")
    sweep = sweep.merge(levels, how="cross")
    pairs = pd.concat([probes, sweep], ignore_index=True)
    if pairs.empty:
        return pd.DataFrame(columns=COLUMNS[:-1])
    delay = pairs.get("median_scheduling_delay_ms", pd.Series(float("nan"), pairs.index))
    kept_pace = ~(pairs.get("completion_ratio", pd.Series(float("nan"), pairs.index)) < MIN_COMPLETION_RATIO)
    passes = (pairs["p99_tbt_ms"] <= pairs["slo_tbt_ms"]) & ~(delay > max_scheduling_delay_ms) & kept_pace
    found = (pairs.assign(passing_qps=pairs["qps"].where(passes))
             .groupby([*CONFIG_KEYS, *SLO_KEYS], sort=False, dropna=False)
             .agg(capacity_qps=("passing_qps", "max"), highest=("qps", "max"), lowest=("qps", "min")).reset_index())
    bound = [UPPER if pd.isna(qps) else LOWER if qps == highest else EXACT
             for qps, highest in zip(found["capacity_qps"], found["highest"], strict=True)]
    found = found.assign(capacity_qps=found["capacity_qps"].fillna(0.0), capacity_bound=bound)
    found["capacity_display"] = [capacity_text(r.capacity_qps, r.capacity_bound, r.lowest)
                                 for r in found.itertuples()]
    return found.drop(columns=["highest", "lowest"])


def capacity_table(results_dir: str | Path, runs: pd.DataFrame, slos: Mapping[str, float],
                   max_scheduling_delay_ms: float = MAX_SCHEDULING_DELAY_MS) -> pd.DataFrame:
    """Capacity from the best source of each experiment, with `ratio_to_vllm` (capacity / the
    `vllm` capacity under the same SLO in the same experiment; NaN without a nonzero baseline, and where
    either capacity is only a bound)."""
    searched = load_capacity_json(results_dir)
    derived = capacity_from_runs(runs[~runs["experiment"].isin(searched["experiment"])], slos,
                                 max_scheduling_delay_ms)
    table = pd.concat([frame for frame in (searched, derived) if not frame.empty] or [searched],
                      ignore_index=True)
    exact = table["capacity_qps"].where(table["capacity_bound"] == EXACT)
    baseline = (exact[table["scheduler"] == BASELINE].groupby([table["experiment"], table["slo_name"]])
                .max().rename("baseline"))
    table = table.join(baseline, on=["experiment", "slo_name"])
    return (table.assign(ratio_to_vllm=exact / table["baseline"].where(table["baseline"] > 0))
            .sort_values(["slo_tbt_ms"], kind="stable").reindex(columns=COLUMNS).reset_index(drop=True))


def bar_label(row) -> str:
    """A capacity bar's label: the number, or the bound on one line and what it is bounded by below."""
    return row.capacity_display.replace(" (", "\n(")


def capacity_note(table: pd.DataFrame) -> str:
    """Markdown line: where the capacities come from, and what is missing."""
    if table.empty:
        return ("**No capacity data**: no `capacity.json`, no capacity-search runs, and no sweep runs "
                "with an SLO to check.")
    sources = table.groupby("experiment")["source"].unique()
    notes = [f"Capacity of `{exp}` from {' and '.join(src)}." for exp, src in sources.items()]
    if not (table["scheduler"] == BASELINE).any():
        notes.append(f"No `{BASELINE}` capacity: ratios to {BASELINE} are not available.")
    return " ".join(notes)
