"""Generation stalls: pick runs to compare, long-running requests to follow, per-run stall numbers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd


def representative_runs(runs: pd.DataFrame, qps: float | None = None, chunk_size: int | None = None,
                        relaxed_slo_ms: float | None = None) -> pd.DataFrame:
    """One run with request records per policy, for the stall timeline.

    QPS: `qps`; else, given `relaxed_slo_ms`, the highest QPS at which every policy has a run within it
    (P99 TBT), each policy's run there with the lowest P99 TBT (`chunk_size` restricts chunking policies);
    else (or with no such QPS) the highest QPS every policy ran, else each policy's highest, chunking
    policies at `chunk_size`, else their largest chunk size at that QPS. Keeps the order of `runs`.
    """
    has_requests = [isinstance(d, str) and (Path(d) / "requests.parquet").is_file() for d in runs["run_dir"]]
    runs = runs.loc[np.array(has_requests, dtype=bool)]
    if runs.empty:
        return runs
    chunk_ok = runs["chunk_size"].isna() | (chunk_size is None) | (runs["chunk_size"] == chunk_size)
    if qps is None and relaxed_slo_ms is not None:
        meeting = runs[chunk_ok & (runs["p99_tbt_ms"] <= relaxed_slo_ms)]
        common = _common_qps(meeting, set(runs["scheduler"]))
        if common:
            chosen = meeting[meeting["qps"] == max(common)]
            return chosen.sort_values("p99_tbt_ms", kind="stable").groupby(
                "scheduler", sort=False).head(1).sort_index()
    if qps is None:
        common = _common_qps(runs, set(runs["scheduler"]))
        qps = max(common) if common else None
    wanted = qps if qps is not None else runs.groupby("scheduler")["qps"].transform("max")
    chosen = runs[(runs["qps"] == wanted) & chunk_ok]
    return chosen.sort_values("chunk_size", ascending=False, na_position="last").groupby(
        "scheduler", sort=False).head(1).sort_index()


def _common_qps(runs: pd.DataFrame, policies: set[str]) -> set[float]:
    """The QPS every one of `policies` has a run of in `runs`."""
    if set(runs["scheduler"]) != policies:
        return set()
    return set.intersection(*(set(g) for _, g in runs.groupby("scheduler")["qps"]))


def selection_note(runs: pd.DataFrame, chosen: pd.DataFrame, relaxed_slo_ms: float | None = None) -> str:
    """Markdown line: which run stands for each policy, whether they meet the relaxed SLO, and which policies
    have no per-request data."""
    if chosen.empty:
        return ("**No run to show**: none has per-request records (requests.parquet) at the chosen QPS "
                "and chunk size.")
    picked = [f"{r.config} @ {r.qps:g} QPS (`{r.run_id}`)" for r in chosen.itertuples()]
    missing = sorted(set(runs["scheduler"]) - set(chosen["scheduler"]))
    note = f"Runs compared: {', '.join(picked)}."
    if relaxed_slo_ms is not None:
        over = chosen[~(chosen["p99_tbt_ms"] <= relaxed_slo_ms)]
        note += (f" Each is its policy's run with the lowest P99 TBT at the highest QPS where every policy meets "
                 f"the relaxed SLO ({relaxed_slo_ms:.0f} ms)." if over.empty else
                 f" **No QPS at which every policy meets the relaxed SLO ({relaxed_slo_ms:.0f} ms)**: "
                 f"{', '.join(over['config'])} miss it here.")
    return note + (f" No per-request records for: {', '.join(missing)}." if missing else "")


def stall_caption(table: pd.DataFrame, strictest_slo: str | None = None) -> str:
    """Markdown caption of a `stall_summary` table, from its numbers: each run's decode stalls and TBT, and
    which run is lower on each of them."""
    if table.empty or "p99_tbt_ms" not in table:
        return "No token gaps to compare."
    over = f"gaps_over_{strictest_slo}_pct" if strictest_slo else None
    lines = []
    for r in table.itertuples():
        stalls = ("" if pd.isna(getattr(r, "stall_iterations", np.nan)) else
                  f"{r.stall_iterations:.0f} of {r.iterations:.0f} iterations were decode stalls "
                  f"({r.stall_time_pct:.1f}% of busy time), ")
        gaps = f", {getattr(r, over):.1f}% of token gaps over the {strictest_slo} SLO" if over in table else ""
        lines.append(f"**{r.config}** @ {r.qps:g} QPS: {stalls}P99 TBT {r.p99_tbt_ms:.0f} ms, "
                     f"max {r.max_tbt_ms:.0f} ms{gaps}.")
    if len(table) > 1:
        metrics = {"stall_time_pct": "decode-stall time", "p99_tbt_ms": "P99 TBT", "max_tbt_ms": "max TBT",
                   **({over: f"gaps over the {strictest_slo} SLO"} if over in table else {})}
        lowest: dict[str, list[str]] = {}
        for column, name in metrics.items():
            values = table[column].dropna() if column in table else pd.Series(dtype=float)
            if len(values) == len(table) and values.nunique() > 1:
                lowest.setdefault(table.loc[values.idxmin(), "config"], []).append(name)
        lines += [f"Lowest with {config}: {', '.join(names)}." for config, names in lowest.items()]
    return " ".join(lines)


def long_requests(gaps: pd.DataFrame, n: int = 3) -> pd.DataFrame:
    """TBT rows (`load.token_gaps`) of `n` long-running, overlapping requests per run.

    The *anchor* is the request with the most tokens; the others are those with the most tokens
    during the anchor's lifetime. Adds `rank` (0 = anchor) and `t_anchor_start` / `t_anchor_end`.
    """
    picked = [_long_requests_of_run(run, n) for _, run in gaps.groupby("run_id", sort=False)]
    return pd.concat(picked, ignore_index=True) if picked else gaps.assign(rank=0)


def stall_summary(runs: pd.DataFrame, batches: pd.DataFrame, gaps: pd.DataFrame,
                  slos: Mapping[str, float]) -> pd.DataFrame:
    """Per run: iterations, decode-stall iterations (`load.load_batches`) and their share of busy
    time, TBT P99 / max, and the share of token gaps above each SLO."""
    table = runs.set_index("run_id")[["config", "qps"]]
    if not batches.empty:
        by_run = batches.groupby("run_id")
        table = table.assign(
            iterations=by_run.size(), stall_iterations=by_run["decode_stall"].sum(),
            stall_time_pct=100.0 * batches["iteration_ms"].where(batches["decode_stall"], 0.0)
            .groupby(batches["run_id"]).sum() / by_run["iteration_ms"].sum())
    if not gaps.empty:
        tbt = gaps.groupby("run_id")["tbt_ms"]
        table = table.assign(p99_tbt_ms=tbt.quantile(0.99), max_tbt_ms=tbt.max(), **{
            f"gaps_over_{name}_pct": 100.0 * (gaps["tbt_ms"] > slo).groupby(gaps["run_id"]).mean()
            for name, slo in slos.items()})
    return table.reset_index()


def _long_requests_of_run(gaps: pd.DataFrame, n: int) -> pd.DataFrame:
    anchor = gaps["request_id"].value_counts().index[0]
    span = gaps.loc[gaps["request_id"] == anchor, "time"].agg(["min", "max"])
    inside = gaps[gaps["time"].between(span["min"], span["max"])]
    ranked = [anchor, *[r for r in inside["request_id"].value_counts().index if r != anchor]][:n]
    rank = {request_id: i for i, request_id in enumerate(ranked)}
    return gaps[gaps["request_id"].isin(rank)].assign(
        rank=lambda g: g["request_id"].map(rank), t_anchor_start=span["min"], t_anchor_end=span["max"])
