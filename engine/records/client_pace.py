"""Whether the client kept its schedule (``per_request_metrics`` rows): the schedule lag of each send, the part of
it a concurrency cap held the request back on purpose (``arrival.max_concurrency``), and the offered and
achieved send rates. A run whose client fell behind measured a load other than the one it names."""
from __future__ import annotations

import numpy as np
import pandas as pd

MAX_SCHEDULE_LAG_P99_MS = 10.0
MIN_ACHIEVED_FRACTION = 0.95


def send_rate(times: pd.Series) -> float | None:
    """Requests per second over a series of send times: (n - 1) / span (None when span is 0)."""
    times = times.dropna()
    span = times.max() - times.min() if len(times) else 0.0
    return float((len(times) - 1) / span) if span > 0 else None


def _quantiles(name: str, values_ms: pd.Series) -> dict:
    if values_ms.empty:
        return dict.fromkeys((f"{name}_p50_ms", f"{name}_p99_ms", f"{name}_max_ms"))
    p50, p99 = (float(x) for x in np.percentile(values_ms, [50, 99]))
    return {f"{name}_p50_ms": p50, f"{name}_p99_ms": p99, f"{name}_max_ms": float(values_ms.max())}


def client_pace(df: pd.DataFrame) -> dict:
    """``schedule_lag_*`` (actual - intended send), ``client_wait_*`` and ``mean_client_wait_ms`` (None without a
    cap), ``offered_rate`` / ``achieved_rate`` (of the intended / actual sends) and ``client_fell_behind``: the
    p99 lag of the requests no cap held over MAX_SCHEDULE_LAG_P99_MS (theirs is the dispatcher's own), or,
    without a cap, an achieved rate under MIN_ACHIEVED_FRACTION of the offered one."""
    lag, waits = df["schedule_lag_ms"].dropna(), df["client_wait_ms"].dropna()
    own_lag = df["schedule_lag_ms"][~(df["client_wait_ms"] > 0)].dropna()
    offered, achieved = send_rate(df["intended_send_time"]), send_rate(df["send_time"])
    fell_behind = (len(own_lag) > 0 and float(np.percentile(own_lag, 99)) > MAX_SCHEDULE_LAG_P99_MS) or (
        waits.empty and offered is not None and (achieved or 0.0) < MIN_ACHIEVED_FRACTION * offered)
    return {**_quantiles("schedule_lag", lag), **_quantiles("client_wait", waits),
            "mean_client_wait_ms": float(waits.mean()) if len(waits) else None,
            "offered_rate": offered, "achieved_rate": achieved, "client_fell_behind": bool(fell_behind)}
