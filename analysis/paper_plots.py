"""Figures of the Sarathi-Serve study on simulated GPU deployments (analysis.paper), like the paper's capacity
bars: one row of panels per deployment, one panel per trace and SLO, and the headline ratios beside the
paper's."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from stallfree.analysis.capacity import bar_label
from stallfree.analysis.figure_style import finish, message, style
from stallfree.analysis.paper import DEPLOYMENTS, POLICIES
from stallfree.analysis.plots import policy_palette


def _caveat(fig: Figure, caveat: str | None) -> str:
    """The mark every ratio of a reduced study carries ("†"), explained under the figure; "" at full size."""
    if caveat is None:
        return ""
    width = int(fig.get_figwidth() * 13)  # characters of a 9 pt line across the figure
    fig.supxlabel(textwrap.fill(f"† {caveat}", width), fontsize=9, color="#b00000")
    return "†"


def capacity_bars(table: pd.DataFrame, save: str | Path | None = None, caveat: str | None = None) -> Figure:
    """Capacity (QPS) per policy, annotated with the ratio to vllm, for every deployment, trace and SLO; a
    capacity that is a lower bound (the highest QPS tried passed) is marked "≥". ``caveat``: a reduced
    study's (analysis.paper.size_caveat), beside every ratio."""
    table = table[table["policy"].isin(POLICIES)].dropna(subset=["capacity_qps"])
    if table.empty:
        return message("No capacity searches of simulated deployments: run `make paper`.", save)
    deployments = [d for d in DEPLOYMENTS if d in set(table["deployment"])]
    panels = list(dict.fromkeys(zip(table["trace"], table["slo"], strict=True)))
    palette = policy_palette(list(POLICIES))
    with style():
        fig = Figure(figsize=(3.2 * len(panels), 2.6 * len(deployments)), layout="constrained")
        axes = fig.subplots(len(deployments), len(panels), squeeze=False)
        mark = _caveat(fig, caveat)
        for row, deployment in zip(axes, deployments, strict=True):
            for ax, (trace, slo) in zip(row, panels, strict=True):
                cell = table[(table["deployment"] == deployment) & (table["trace"] == trace) & (table["slo"] == slo)]
                cell = cell.set_index("policy").reindex([p for p in POLICIES if p in set(cell["policy"])])
                drawn = ax.bar(range(len(cell)), cell["capacity_qps"], color=[palette[p] for p in cell.index])
                ax.bar_label(drawn, fontsize=8, padding=2, labels=[
                    bar_label(r) if r.capacity_qps == 0  # none passed: "< the lowest QPS tried", no ratio
                    else (("≥" if r.lower_bound else "") + f"{r.capacity_qps:.2g}"
                          + ("" if p == "vllm" or pd.isna(r.ratio_to_vllm)
                             else f"\n{'≥' if r.lower_bound else ''}{r.ratio_to_vllm:.1f}×{mark}"))
                    for p, r in cell.iterrows()])
                ax.set_xticks(range(len(cell)), cell.index, fontsize=8)
                slo_ms = cell["slo_tbt_ms"].dropna()
                ax.set_title(f"{deployment}\n{trace}, {slo}" + (f" ({slo_ms.iloc[0]:g} ms)" if len(slo_ms) else ""),
                             fontsize=8)
                ax.margins(y=0.35)
                ax.grid(axis="x", visible=False)
            row[0].set_ylabel("capacity (QPS)")
        return finish(fig, save)


def headline_bars(headline: pd.DataFrame, save: str | Path | None = None, caveat: str | None = None) -> Figure:
    """The paper's headline capacity gains beside the project's (analysis.paper.headline), of the deployments
    the results hold; a gain that is a lower bound is marked "≥". ``caveat``: a reduced study's, beside every
    ratio of ours."""
    headline = headline.dropna(subset=["ours"])
    if headline.empty:
        return message("No sarathi / baseline capacity pairs yet: run `make paper`.", save)
    labels = [f"{r.deployment}\nover {r.over}" for r in headline.itertuples()]
    x = range(len(labels))
    with style():
        fig = Figure(figsize=(1.6 * len(labels) + 2, 4.2), layout="constrained")
        ax = fig.subplots()
        mark = _caveat(fig, caveat)
        paper = ax.bar([i - 0.2 for i in x], headline["paper"], width=0.4, color="0.6", label="paper (GPU)")
        ours = ax.bar([i + 0.2 for i in x], headline["ours"], width=0.4, color="#029e73",
                      label="this project (simulated)")
        ax.bar_label(paper, labels=[f"{v:.1f}×" for v in headline["paper"]], fontsize=8, padding=2)
        ax.bar_label(ours, labels=[f"{'≥' if r.ours_lower_bound else ''}{r.ours:.1f}×{mark}"
                                   for r in headline.itertuples()], fontsize=8, padding=2)
        ax.axhline(1.0, color="0.3", linewidth=0.8)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("sarathi's capacity gain (up to)")
        ax.legend(fontsize=8)
        ax.margins(y=0.15)
        ax.grid(axis="x", visible=False)
        return finish(fig, save)
