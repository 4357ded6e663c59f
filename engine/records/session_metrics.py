"""Per-session results beside the per-request ones (``request_metrics`` rows of a session workload,
loadgen.workload.sessions): one row per session, and the summary's session fields. A follow-up turn's TTFT counts
from its scheduled send, its think time after the turn before it ended, so it is apart from first turns'."""
from __future__ import annotations

import numpy as np
import pandas as pd

from stallfree.engine.records.request_spec import CONTEXT_LIMIT

SESSION_FIELDS = ("num_sessions", "sessions_completed", "sessions_failed", "sessions_context_limit",
                  "mean_turns_per_session", "median_session_duration_s", "p90_session_duration_s",
                  "median_ttft_first_turn_ms", "p90_ttft_first_turn_ms", "median_ttft_follow_up_ms",
                  "p90_ttft_follow_up_ms")


def session_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per session: ``turns`` (rows), ``turns_ok``, ``status`` (ok: every turn ok, else the first other
    status), ``session_end`` (why it ended after its last turn; None when a turn failed), ``duration_s`` (first
    scheduled send to last end), ``first_ttft_ms`` and ``median_follow_up_ttft_ms``."""
    rows = df[df["session_id"].notna()] if "session_id" in df else df.iloc[0:0]
    columns = ["session_id", "turns", "turns_ok", "status", "session_end", "duration_s", "first_ttft_ms",
               "median_follow_up_ttft_ms"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for session_id, turns in rows.sort_values("turn", kind="stable").groupby("session_id", sort=False):
        ok = turns["status"] == "ok"
        failed = turns.loc[~ok, "status"]
        follow_ups = turns.loc[turns["turn"] > 0, "ttft_ms"].dropna()
        out.append({"session_id": session_id, "turns": len(turns), "turns_ok": int(ok.sum()),
                    "status": "ok" if failed.empty else failed.iloc[0],
                    "session_end": turns["session_end"].dropna().iloc[-1] if failed.empty
                    and turns["session_end"].notna().any() else None,
                    "duration_s": float(turns["finish_time"].max() - turns["intended_send_time"].min()),
                    "first_ttft_ms": float(turns["ttft_ms"].iloc[0]),
                    "median_follow_up_ttft_ms": float(follow_ups.median()) if len(follow_ups) else np.nan})
    return pd.DataFrame(out, columns=columns)


def _quantile(values: pd.Series, q: float) -> float | None:
    values = values.dropna()
    return float(np.percentile(values, q)) if len(values) else None


def session_summary(df: pd.DataFrame) -> dict:
    """The summary's session fields (SESSION_FIELDS; all None for a workload without sessions)."""
    table = session_table(df)
    if table.empty:
        return dict.fromkeys(SESSION_FIELDS)
    ok = df[df["session_id"].notna() & (df["status"] == "ok")]
    first, follow_up = ok.loc[ok["turn"] == 0, "ttft_ms"], ok.loc[ok["turn"] > 0, "ttft_ms"]
    return {"num_sessions": len(table), "sessions_completed": int((table["status"] == "ok").sum()),
            "sessions_failed": int((table["status"] != "ok").sum()),
            "sessions_context_limit": int((table["session_end"] == CONTEXT_LIMIT).sum()),
            "mean_turns_per_session": float(table["turns"].mean()),
            "median_session_duration_s": _quantile(table["duration_s"], 50),
            "p90_session_duration_s": _quantile(table["duration_s"], 90),
            "median_ttft_first_turn_ms": _quantile(first, 50), "p90_ttft_first_turn_ms": _quantile(first, 90),
            "median_ttft_follow_up_ms": _quantile(follow_up, 50), "p90_ttft_follow_up_ms": _quantile(follow_up, 90)}
