"""The report's prefix-reuse and sessions table: for each run, the hit rate the workload's prompts give an unbounded
prefix cache beside the one the server measured (and whether they part by the warning's margin), and for a session
workload its sessions and the TTFT of first turns apart from follow-ups."""
from __future__ import annotations

import pandas as pd

from stallfree.engine.records.server_summary import PREFIX_CACHE_WARN_POINTS as WARN_POINTS

SESSION_COLUMNS = {"num_sessions": "sessions", "sessions_completed": "completed",
                   "sessions_context_limit": "ended at context", "mean_turns_per_session": "turns / session",
                   "median_ttft_first_turn_ms": "TTFT first turn p50 (ms)",
                   "median_ttft_follow_up_ms": "TTFT follow-up p50 (ms)"}


def _label(runs: pd.DataFrame) -> pd.Series:
    engine = runs["engine_label"] if "engine_label" in runs else pd.Series(pd.NA, index=runs.index)
    return engine.fillna(runs["config"]) if "config" in runs else engine


def reuse_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run that recorded a hit rate (the workload's or the server's) or sessions; empty otherwise.
    Hit rates in %, ``gap`` in points (server - ideal); ``check`` says "warm cache?" or "less than ideal" past
    WARN_POINTS, "unknown" where the server gave no counters (never 0%)."""
    def column(name: str) -> pd.Series:
        return runs[name] if name in runs else pd.Series(pd.NA, index=runs.index, dtype="Float64")

    ideal, server = column("workload_ideal_hit_rate").astype("Float64"), column("server_prefix_cache_hit_rate")
    server = server.astype("Float64")
    keep = ideal.notna() | server.notna() | column("num_sessions").notna()
    if not keep.any():
        return pd.DataFrame()
    gap = server - ideal.fillna(0.0)
    check = pd.Series("ok", index=runs.index).mask(gap >= WARN_POINTS, "warm cache?").mask(
        gap <= -WARN_POINTS, "less than ideal").mask(server.isna(), "unknown")
    table = pd.DataFrame({"run": _label(runs), "workload": column("workload"), "qps": column("qps"),
                          "ideal hit %": (100 * ideal).round(1), "server hit %": (100 * server).round(1),
                          "gap (points)": (100 * gap).round(1), "check": check})
    if column("num_sessions").notna().any():
        for key, name in SESSION_COLUMNS.items():
            table[name] = pd.to_numeric(column(key), errors="coerce").round(1)
    return table[keep].reset_index(drop=True)
