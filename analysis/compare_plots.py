"""Figures of an engine comparison (analysis.compare): every engine's throughput-latency frontier on one
pair of axes, and its capacity beside the others'. Colours follow the table's engine order, the same in
both figures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from stallfree.analysis.figure_style import finish, log_scale, message, style
from stallfree.analysis.load import disturbed_mask
from stallfree.analysis.pareto import pareto_front
from stallfree.analysis.plots import LABELS

FRONTIER_LATENCIES = ("p99_tbt_ms", "p99_ttft_ms")
MISSING_COLOR = "0.8"


def engine_palette(engines: list[str]) -> dict[str, tuple]:
    return dict(zip(engines, sns.color_palette("tab10", len(engines)), strict=True))


def frontiers_plot(runs: pd.DataFrame, engines: list[str], save: str | Path | None = None) -> Figure:
    """Output throughput vs P99 TBT and vs P99 TTFT, one colour per engine (`engine` column, drawn in the
    order of `engines`): every run a point, labelled with its QPS, each engine's Pareto frontier a line,
    the runs' TBT SLO a dashed line, disturbed runs hollow."""
    points = runs[runs["engine"].isin(engines)].dropna(subset=["output_throughput"])
    if points.empty:
        return message("No runs of the compared engines.", save)
    palette = engine_palette(engines)
    disturbed = disturbed_mask(points)
    with style():
        fig = Figure(figsize=(12, 4.8), layout="constrained")
        axes = fig.subplots(1, len(FRONTIER_LATENCIES), sharey=True)
        for ax, latency in zip(axes, FRONTIER_LATENCIES, strict=True):
            for engine in [e for e in engines if e in set(points["engine"])]:
                mine = points[points["engine"] == engine].dropna(subset=[latency])
                solid = mine[~disturbed[mine.index]]
                color = palette[engine]
                ax.scatter(solid[latency], solid["output_throughput"], color=color, s=40, zorder=3, label=engine)
                hollow = mine[disturbed[mine.index]]
                ax.scatter(hollow[latency], hollow["output_throughput"], facecolors="white", edgecolors=[color],
                           s=40, linewidths=1.5, zorder=3)
                front = pareto_front(mine, latency, "output_throughput", by=())
                ax.plot(front[latency], front["output_throughput"], color=color, lw=1.8, alpha=0.7, zorder=2)
                for row in mine.itertuples():
                    ax.annotate(f"{row.qps:g}", (getattr(row, latency), row.output_throughput), fontsize=7,
                                color=color, xytext=(3, 3), textcoords="offset points")
            if latency == "p99_tbt_ms":
                for slo_ms in points["slo_tbt_ms"].dropna().unique():
                    ax.axvline(slo_ms, color="0.3", ls="--", lw=1.2, zorder=1)
            log_scale(ax, "x")
            ax.set(xlabel=LABELS[latency], ylabel=LABELS["output_throughput"])
        axes[-1].legend(title="engine (labels: QPS; hollow: disturbed)", loc="upper left", bbox_to_anchor=(1.02, 1),
                        frameon=False, fontsize=9)
        fig.suptitle("Throughput vs tail latency, every run; lines: each engine's Pareto frontier; "
                     "dashed: the TBT SLO", fontsize=10)
        return finish(fig, save)


def capacity_bars(table: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """One bar per contender of `load_compare` (analysis.compare) in its order, annotated with the capacity
    as the search supports it and the ratio to the baseline; a missing contender a grey slot."""
    if table.empty:
        return message("No comparison: no compare.json.", save)
    palette = engine_palette(list(table["engine"]))
    measured = table["status"].eq("measured")
    heights = table["capacity_qps"].where(measured, 0.0).astype(float)
    with style():
        fig = Figure(figsize=(max(5.0, 1.8 * len(table) + 1.5), 4.6), layout="constrained")
        ax = fig.subplots()
        bars = ax.bar(range(len(table)), heights, width=0.65,
                      color=[palette[e] if m else MISSING_COLOR for e, m in zip(table["engine"], measured, strict=True)])
        labels = [_bar_label(r) for r in table.itertuples()]
        ax.bar_label(bars, labels=labels, padding=2, fontsize=9)
        ax.set_xticks(range(len(table)), table["engine"], rotation=15 if len(table) > 3 else 0)
        slo = table[measured].drop_duplicates("slo_tbt_ms")["slo_tbt_ms"]
        where = f": P99 TBT ≤ {slo.iloc[0]:.0f} ms" if len(slo) == 1 else " (different SLOs: see the note)"
        ax.set(ylabel=LABELS["capacity_qps"], title=f"Capacity per engine{where}")
        ax.margins(y=0.3)
        ax.grid(axis="x", visible=False)
        return finish(fig, save)


def _bar_label(row) -> str:
    if row.status != "measured":
        return "missing"
    if row.engine == row.baseline:
        return f"{row.capacity_text} QPS"
    ratio = f"ratio to {row.baseline} unknown" if row.ratio_text == "?" else f"{row.ratio_text} vs {row.baseline}"
    return f"{row.capacity_text} QPS\n{ratio}"
