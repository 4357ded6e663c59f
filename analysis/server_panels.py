"""The stall timeline's server rows (analysis.plots.stall_timeline_plot): a run's queue (requests running
and waiting) and KV-cache usage over time, from the server's /metrics (`load.load_server_metrics`)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

QUEUE_COLORS = {"requests_running": "#0173b2", "requests_waiting": "#d55e00"}
KV_COLOR = "#029e73"
NO_SERVER_METRICS = pd.DataFrame(columns=["run_id", "time", "metric", "value", "series"])


def server_panels(axes: np.ndarray, server: pd.DataFrame, batches: pd.DataFrame, t0: float,
                  reason: str | None) -> None:
    """The run's queue (running / waiting requests) and KV-cache usage over time: from its server's
    /metrics, the queue from its batch records where it has no scrapes; else a line saying why not."""
    queue_ax, kv_ax = axes
    queue = server[server["metric"].isin(QUEUE_COLORS)]
    source = "server /metrics"
    if queue.empty and {"num_running", "num_waiting"} <= set(batches.columns) and not batches.empty:
        queue = batches.melt(id_vars="start_time", value_vars=["num_running", "num_waiting"],
                             var_name="metric").rename(columns={"start_time": "time"})
        queue["metric"] = queue["metric"].str.replace("num_", "requests_")
        source = "engine iterations"
    kv = server[server["metric"] == "kv_cache_usage"]
    missing = "no server metrics" + (f": {reason}" if isinstance(reason, str) and reason else "")
    for ax, frame in ((queue_ax, queue), (kv_ax, kv)):
        if frame.empty:
            ax.text(0.5, 0.5, textwrap.fill(missing, 60), ha="center", va="center", transform=ax.transAxes,
                    color="0.4", fontsize=8)
    for metric, rows in queue.groupby("metric"):
        rows = rows.sort_values("time")
        queue_ax.step(rows["time"] - t0, rows["value"], where="post", color=QUEUE_COLORS[metric], lw=1.2)
    if not queue.empty:
        queue_ax.text(0.99, 0.95, source, ha="right", va="top", transform=queue_ax.transAxes, fontsize=7, color="0.4")
    kv = kv.sort_values("time")
    kv_ax.step(kv["time"] - t0, kv["value"] * 100, where="post", color=KV_COLOR, lw=1.2)
    kv_ax.set_ylim(bottom=0)
    queue_ax.set_ylim(bottom=0)
