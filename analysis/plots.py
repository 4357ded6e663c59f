"""Seaborn figures for the notebooks. Every function returns a matplotlib Figure (built without pyplot,
so nothing leaks between calls) and, given `save`, also writes it there as PNG. Empty inputs give a
figure that says what is missing instead of raising."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from stallfree.analysis.capacity import BASELINE, bar_label
from stallfree.analysis.figure_style import finish, log_scale, message, style
from stallfree.analysis.load import NO_CHUNK
from stallfree.analysis.pareto import pareto_front
from stallfree.analysis.repeats import repeat_summary
from stallfree.analysis.server_panels import NO_SERVER_METRICS, QUEUE_COLORS, server_panels
from stallfree.analysis.stalls import long_requests
from stallfree.engine.records.policies import POLICIES

LABELS = {
    "p99_tbt_ms": "P99 TBT (ms)", "median_tbt_ms": "P50 TBT (ms)", "median_ttft_ms": "P50 TTFT (ms)",
    "p99_ttft_ms": "P99 TTFT (ms)", "p99_e2el_ms": "P99 E2E latency (ms)",
    "output_throughput": "Output throughput (tokens/s)", "request_throughput": "Request throughput (req/s)",
    "capacity_qps": "Capacity (QPS)", "qps": "QPS (req/s)", "scheduler": "policy", "chunk": "chunk size",
}
KIND_COLORS = {"prefill": "#d62728", "hybrid": "#9467bd", "decode": "#7f7f7f"}
STALL_COLOR = "#ffcccc"
REQUEST_COLORS = ("#0173b2", "#de8f05", "#029e73", "#56b4e9", "#ece133")
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0}


def figure_dir(results_dir: str | Path, override: str | Path | None = None) -> Path:
    """Where the notebooks save their PNGs: `override`, else RESULTS_DIR/figures."""
    return Path(override) if override else Path(results_dir) / "figures"


def policy_palette(schedulers: pd.Series | list[str]) -> dict[str, tuple]:
    """One fixed colour per policy (same in every figure); unknown policies follow."""
    names = [*POLICIES, *sorted(set(schedulers) - set(POLICIES))]
    return dict(zip(names, sns.color_palette("tab10", len(names)), strict=True))


def pareto_plot(runs: pd.DataFrame, latency: str = "p99_tbt_ms", throughput: str = "output_throughput",
                slos: Mapping[str, float] | None = None, save: str | Path | None = None) -> Figure:
    """Throughput vs a latency percentile: one point per run, or the mean of a point's repeats with
    its 95% intervals as error bars (colour = policy, marker = chunk size, size = QPS), the Pareto
    frontier of each policy (per experiment) as a line, SLOs as dashed vertical lines, disturbed runs
    hollow and named below. `slos` defaults to the runs' configured `slo_ttft_ms` / `slo_tbt_ms`
    matching the latency metric."""
    points = runs.dropna(subset=[c for c in (latency, throughput) if c in runs])
    if points.empty or not {latency, throughput} <= set(points.columns):
        return message(f"No runs with {LABELS.get(latency, latency)} and throughput.", save)
    points = repeat_summary(points, [latency, throughput])
    with style():
        fig = Figure(figsize=(8.5, 5.2), layout="constrained")
        ax = fig.subplots()
        palette = policy_palette(points["scheduler"])
        chunks = sorted(set(points["chunk"]), key=lambda c: (c != NO_CHUNK, int(c) if c.isdigit() else 0))
        sns.scatterplot(points, x=latency, y=throughput, hue="scheduler", style="chunk", size="qps",
                        hue_order=[p for p in palette if p in set(points["scheduler"])], style_order=chunks,
                        sizes=(30, 200), palette=palette, alpha=0.85, ax=ax, zorder=3)
        front = pareto_front(points, latency, throughput, by=("experiment", "scheduler"))
        for (_, scheduler), line in front.groupby(["experiment", "scheduler"], sort=False):
            ax.plot(line[latency], line[throughput], color=palette[scheduler], lw=1.8, alpha=0.7, zorder=2)
        _intervals(ax, points, latency, throughput, palette)
        _mark_disturbed(fig, ax, points, latency, throughput, palette)
        log_scale(ax, "x")
        _slo_lines(ax, _configured_slo(points, latency) if slos is None else slos, vertical=True)
        ax.set(xlabel=LABELS.get(latency, latency), ylabel=LABELS.get(throughput, throughput),
               title=f"{LABELS.get(throughput, throughput)} vs {LABELS.get(latency, latency)}")
        handles, labels = ax.get_legend_handles_labels()
        ax.legend([*handles, Line2D([], [], color="0.4", lw=1.8)],
                  [*(LABELS.get(label, label) for label in labels), "Pareto frontier"],
                  loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False, fontsize=9, title=_dtypes(points))
        return finish(fig, save)


def _dtypes(runs: pd.DataFrame) -> str | None:
    """The engines' dtypes (summary `dtype`), e.g. "dtype: bfloat16"; None when no run recorded one."""
    dtypes = sorted(runs["dtype"].dropna().unique()) if "dtype" in runs else []
    return f"dtype: {', '.join(dtypes)}" if dtypes else None


def _intervals(ax: Axes, points: pd.DataFrame, x: str, y: str, palette: Mapping[str, tuple]) -> None:
    """95% intervals of the points measured more than once, as error bars in the policy's colour."""
    for row in points[points["n_repeats"] > 1].itertuples(index=False):
        r = row._asdict()
        ax.errorbar(r[x], r[y], xerr=[[r[x] - r[f"{x}_ci_lo"]], [r[f"{x}_ci_hi"] - r[x]]],
                    yerr=[[r[y] - r[f"{y}_ci_lo"]], [r[f"{y}_ci_hi"] - r[y]]], fmt="none",
                    ecolor=palette[r["scheduler"]], elinewidth=1.2, capsize=3, alpha=0.8, zorder=2)


def _mark_disturbed(fig: Figure, ax: Axes, points: pd.DataFrame, x: str, y: str,
                    palette: Mapping[str, tuple]) -> None:
    """Disturbed points (the engine got too little CPU) drawn hollow, ringed in their policy's colour,
    their runs named under the plot."""
    disturbed = points[points["disturbed"]]
    if disturbed.empty:
        return
    ax.scatter(disturbed[x], disturbed[y], s=90, facecolors="white",
               edgecolors=[palette[s] for s in disturbed["scheduler"]], linewidths=2.0, zorder=4)
    names = ", ".join(run for runs in disturbed["disturbed_runs"] for run in runs)
    fig.supxlabel("hollow: disturbed runs (the engine, or a url run's load generator, got too little of the CPU "
                  f"it asked for): {names}", fontsize=8, color="0.3", ha="left", x=0.01, wrap=True)


def capacity_plot(table: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Capacity bars (`capacity.capacity_table`) per config (colour = policy), one panel per SLO, each
    bar annotated with its capacity (a bound as ">= X" / "< X") and its ratio to `vllm` under the same SLO;
    a capacity searched on several seeds is their mean, with its 95% interval as an error bar."""
    table = table.dropna(subset=["capacity_qps"])
    if table.empty:
        return message("No capacity data: no capacity.json, no capacity-search runs and no sweep runs.",
                        save)
    many = table["experiment"].nunique() > 1
    bars = table.assign(label=(table["experiment"] + "\n" if many else "") + table["config"])
    slos = bars.drop_duplicates("slo_name")[["slo_name", "slo_tbt_ms"]].itertuples(index=False)
    palette = policy_palette(bars["scheduler"])
    labels = list(dict.fromkeys(bars["label"]))
    with style():
        n_panels = bars["slo_name"].nunique()
        fig = Figure(figsize=(max(6.0, 1.2 * len(labels) * n_panels + 1.5), 4.8), layout="constrained")
        axes = fig.subplots(1, n_panels, sharey=True, squeeze=False)[0]
        for ax, (slo_name, slo_ms) in zip(axes, slos, strict=True):
            panel = bars[bars["slo_name"] == slo_name].set_index("label").reindex(labels).dropna(
                subset=["capacity_qps"])
            x = [labels.index(label) for label in panel.index]
            drawn = ax.bar(x, panel["capacity_qps"], width=0.7,
                           color=[palette[scheduler] for scheduler in panel["scheduler"]])
            ax.bar_label(drawn, labels=[_capacity_text(r) for r in panel.itertuples()], padding=2, fontsize=9)
            spread = panel.dropna(subset=["capacity_ci_lo", "capacity_ci_hi"])
            ax.errorbar([labels.index(label) for label in spread.index], spread["capacity_qps"],
                        yerr=[spread["capacity_qps"] - spread["capacity_ci_lo"],
                              spread["capacity_ci_hi"] - spread["capacity_qps"]],
                        fmt="none", ecolor="0.2", capsize=4, zorder=3)
            ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0)
            pad = 0.5 + max(0.0, 1.5 - len(labels) / 2)  # keeps a lone bar from filling the panel
            ax.set_xlim(-pad, len(labels) - 1 + pad)
            ax.set(title=f"{slo_name} SLO: P99 TBT ≤ {slo_ms:.0f} ms", xlabel="policy / chunk size",
                   ylabel=LABELS["capacity_qps"])
            ax.margins(y=0.25)
            ax.grid(axis="x", visible=False)
        if not (bars["scheduler"] == BASELINE).any():
            fig.suptitle(f"no {BASELINE} runs: ratios to {BASELINE} not available", fontsize=10)
        return finish(fig, save)


def stall_timeline_plot(runs: pd.DataFrame, batches: pd.DataFrame, gaps: pd.DataFrame,
                        slos: Mapping[str, float] | None = None, n_requests: int = 3,
                        save: str | Path | None = None, server: pd.DataFrame | None = None) -> Figure:
    """Per run (columns), on one time axis (s since the run's first iteration or token) over the longest
    request's lifetime: with batch records (our engine), prefill / decode tokens per iteration and
    iteration time (and MFU / MBU where known); for every run, the server's queue (requests running and
    waiting) and KV-cache usage from its /metrics (`server`: `load.load_server_metrics`; the queue from
    the batch records where a run has no scrapes), and the TBT of a few long-running requests
    (`stalls.long_requests`). Shaded: decode stalls (prefill-only iterations while other requests wait for
    their next token). A run with neither says why in its panel (its summary's `server_metrics_reason`)."""
    followed = long_requests(gaps, n_requests)
    if runs.empty or followed.empty:
        return message("No runs with per-token times to draw a stall timeline.", save)
    batches = batches[batches["run_id"].isin(runs["run_id"])]
    server = NO_SERVER_METRICS if server is None else server
    utilisation = bool("mfu" in batches and batches["mfu"].notna().any())
    batch_rows = [] if batches.empty else ["Tokens per iteration", "Iteration time (ms)",
                                           *(["MFU / MBU (%)"] * utilisation)]
    labels = [*batch_rows, "Requests", "KV cache used (%)", "TBT (ms)"]
    ratios = [1.0] * len(batch_rows) + [0.7, 0.7, 1.0]
    with style():
        fig = Figure(figsize=(5.2 * len(runs) + 1.8, 2.7 * sum(ratios) + 0.6), layout="constrained")
        axes = fig.subplots(len(labels), len(runs), sharex="col", sharey="row", squeeze=False,
                            gridspec_kw={"height_ratios": ratios})
        windows = {}
        for run in runs.itertuples():
            run_followed = followed[followed["run_id"] == run.run_id]
            run_batches = batches[batches["run_id"] == run.run_id]
            windows[run.run_id] = (tuple(run_followed[["t_anchor_start", "t_anchor_end"]].iloc[0]) if not run_followed.empty
                                   else (run_batches["start_time"].min(), run_batches["end_time"].max()))
        span = np.nanmax([hi - lo for lo, hi in windows.values()] + [0.0])  # every column the same time span
        for col, run in zip(axes.T, runs.itertuples(), strict=True):
            run_batches = batches[batches["run_id"] == run.run_id]
            run_gaps = gaps[gaps["run_id"] == run.run_id]
            t0 = np.nanmin([run_batches["start_time"].min(), run_gaps["time"].min()])
            col[0].set_title(f"{run.config} @ {run.qps:g} QPS")
            run_followed = followed[followed["run_id"] == run.run_id]
            lo = windows[run.run_id][0]
            hi = lo + span
            if pd.notna(lo) and span > 0:
                col[-1].set_xlim(lo - t0, hi - t0)
            _tbt_panel(col[-1], run_followed, t0, slos or {})
            run_server = server[server["run_id"] == run.run_id]
            server_panels(col[-3:-1], run_server, run_batches, t0, getattr(run, "server_metrics_reason", None))
            if batch_rows:
                visible = (run_batches["end_time"] >= lo) & (run_batches["start_time"] <= hi)
                _batch_panels(col[:len(batch_rows)], run_batches[visible], t0)
                if utilisation:
                    _utilisation_panel(col[2], run_batches[visible], t0)
        for ax, label in zip(axes[:, 0], labels, strict=True):
            ax.set_ylabel(label)
        log_scale(axes[-1, 0], "y")
        axes[-3, -1].legend(handles=[Line2D([], [], color=c, label=m.removeprefix("requests_"))
                                     for m, c in QUEUE_COLORS.items()],
                            loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
        if batch_rows:
            log_scale(axes[1, 0], "y")
            axes[0, -1].legend(handles=[Patch(color=KIND_COLORS["prefill"], label="prefill tokens"),
                                        Patch(color=KIND_COLORS["decode"], label="decode tokens"),
                                        Patch(color=STALL_COLOR, label="decode stall")],
                               loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
            axes[1, -1].legend(handles=[Patch(color=c, label=k if k == "hybrid" else f"{k}-only")
                                        for k, c in KIND_COLORS.items()], title="iteration",
                               loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
        return finish(fig, save)


def _tbt_panel(ax: Axes, followed: pd.DataFrame, t0: float, slos: Mapping[str, float]) -> None:
    ax.set_xlabel("Time since run start (s)")
    if followed.empty:
        ax.text(0.5, 0.5, "no request with 2+ tokens", ha="center", va="center", transform=ax.transAxes)
        return
    for rank, request in followed.groupby("rank"):
        ax.plot(request["time"] - t0, request["tbt_ms"], drawstyle="steps-pre", lw=3.0 / (rank + 1),
                label=request["request_id"].iloc[0], color=REQUEST_COLORS[rank % len(REQUEST_COLORS)])
    _slo_lines(ax, slos, vertical=False)
    ax.legend(title="longest-running requests", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3,
              frameon=False, fontsize=8, title_fontsize=8)


def _utilisation_panel(ax: Axes, batches: pd.DataFrame, t0: float) -> None:
    """Each iteration's MFU and MBU (%) as steps over its span."""
    for metric, color in (("mfu", "#0173b2"), ("mbu", "#de8f05")):
        ax.step(batches["start_time"] - t0, batches[metric] * 100, where="post", color=color, lw=1.2,
                label=metric.upper())
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", frameon=False, fontsize=8, ncol=2)


def _batch_panels(axes: np.ndarray, batches: pd.DataFrame, t0: float) -> None:
    tokens_ax, time_ax = axes[:2]
    if batches.empty:
        for ax in (tokens_ax, time_ax):
            ax.text(0.5, 0.5, "no batch records for this run", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        return
    left, width = batches["start_time"] - t0, batches["end_time"] - batches["start_time"]
    tokens_ax.bar(left, batches["num_prefill_tokens"], width=width, align="edge",
                  color=KIND_COLORS["prefill"], lw=0)
    tokens_ax.bar(left, batches["num_decode_tokens"], width=width, align="edge",
                  bottom=batches["num_prefill_tokens"], color=KIND_COLORS["decode"], lw=0)
    time_ax.bar(left, batches["iteration_ms"], width=width, align="edge",
                color=batches["kind"].map(KIND_COLORS), lw=0)
    stalled = batches[batches["decode_stall"]]
    for ax in axes:
        ax.broken_barh(list(zip(stalled["start_time"] - t0, stalled["iteration_ms"] / 1000.0, strict=True)),
                       (0, 1), transform=ax.get_xaxis_transform(), color=STALL_COLOR, zorder=0)


def _configured_slo(runs: pd.DataFrame, latency: str) -> dict[str, float]:
    column = next((c for c in ("slo_ttft_ms", "slo_tbt_ms") if c.removeprefix("slo_") in latency), None)
    values = runs[column].dropna() if column in runs else pd.Series(dtype=float)
    return {"configured": float(values.max())} if len(values) else {}


def _slo_lines(ax: Axes, slos: Mapping[str, float], vertical: bool) -> None:
    for (name, value), line_style in zip(slos.items(), ("--", ":", "-."), strict=False):
        label = f"{name} SLO {value:.0f} ms"
        if vertical:
            ax.axvline(value, color="0.3", ls=line_style, lw=1.2, zorder=1)
            ax.text(value, 0.02, label, transform=ax.get_xaxis_transform(), rotation=90,
                    va="bottom", ha="right", fontsize=8, color="0.3", bbox=LABEL_BOX)
        else:
            ax.axhline(value, color="0.3", ls=line_style, lw=1.2, zorder=1)
            ax.text(0.01, value, label, transform=ax.get_yaxis_transform(), va="bottom",
                    fontsize=8, color="0.3", bbox=LABEL_BOX)


def _capacity_text(row) -> str:
    if row.scheduler == BASELINE or pd.isna(row.ratio_to_vllm):
        return bar_label(row)
    return f"{bar_label(row)}\n{row.ratio_to_vllm:.1f}× {BASELINE}"
