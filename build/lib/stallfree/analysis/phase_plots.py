"""Figures of the characterisation studies (analysis/notebooks/phases.ipynb), from phases.csv."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from stallfree.analysis.figure_style import finish, log_scale, message, style
from stallfree.analysis.phases import SPLIT, chunking_overhead, shape_medians, split_medians, title
from stallfree.analysis.plots import KIND_COLORS

SPLIT_COLORS = {"linear_s": "#0173b2", "attention_s": "#de8f05", "other_s": "#bbbbbb"}
SPLIT_LABELS = {"linear_s": "linear layers", "attention_s": "attention", "other_s": "everything else"}


def per_token_plot(frame: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Per-token time against batch size: decodes (one token per sequence) and prefill-only iterations (one
    sequence of that many tokens), log axes."""
    decode = shape_medians(frame, "decode", ["batch_size"])
    prefill = shape_medians(frame, "prefill", ["prefill_tokens"])
    if decode.empty and prefill.empty:
        return message("No decode or prefill iterations (stallfree-bench +experiment=phases).", save)
    with style():
        fig = Figure(figsize=(7.5, 4.2), layout="constrained")
        ax = fig.subplots()
        ax.plot(decode.batch_size, decode.per_token_ms, "o-", color=KIND_COLORS["decode"],
                label=f"decode (context {int(frame[frame.kind == 'decode'].context_tokens.median())})")
        ax.plot(prefill.prefill_tokens, prefill.per_token_ms, "s-", color=KIND_COLORS["prefill"], label="prefill")
        log_scale(ax, "x")
        log_scale(ax, "y")
        ax.set_xlabel("Batch size (decode: sequences; prefill: prompt tokens)")
        ax.set_ylabel("Time per token (ms)")
        ax.set_title(f"Per-token time by phase: {title(frame)}", fontsize=10)
        ax.legend(frameon=False)
        return finish(fig, save)


def split_plot(frame: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """The operator split of each measured shape (median of its sampled iterations), stacked bars in ms."""
    split = split_medians(frame)
    if split.empty:
        return message("No sampled operator split (model.op_split_every = 0).", save)
    with style():
        fig = Figure(figsize=(max(7.5, 0.42 * len(split) + 2), 4.4), layout="constrained")
        ax = fig.subplots()
        bottom = np.zeros(len(split))
        for part in SPLIT:
            ax.bar(split["shape"], split[part] * 1e3, bottom=bottom, color=SPLIT_COLORS[part], label=SPLIT_LABELS[part])
            bottom += split[part].to_numpy() * 1e3
        log_scale(ax, "y")
        ax.set_ylim(bottom=max(0.05, 0.5 * float(np.nanmin(split[SPLIT[0]] * 1e3))))
        ax.set_xlabel("Iteration (decode x batch size; prefill tokens; hybrid prefill + decode tokens)")
        ax.set_ylabel("Time per iteration (ms, log)")
        ax.tick_params(axis="x", rotation=60, labelsize=8)
        ax.set_title(f"Where the time goes: {title(frame)}", fontsize=10)
        ax.legend(frameon=False, loc="upper left")
        return finish(fig, save)


def utilisation_plot(frame: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """MFU and MBU (%) against the tokens in the iteration, per kind of iteration."""
    kinds = [k for k in ("decode", "prefill", "hybrid") if (frame.kind == k).any()]
    if not kinds or frame.mfu.isna().all():
        return message("No MFU / MBU (the run's machine limits are unknown).", save)
    with style():
        fig = Figure(figsize=(10, 4), layout="constrained")
        axes = fig.subplots(1, 2, sharex=True)
        for kind in kinds:
            by = ["batch_size"] if kind == "decode" else ["prefill_tokens", "decode_tokens"]
            points = shape_medians(frame, kind, by).sort_values("tokens")
            for ax, metric in zip(axes, ("mfu", "mbu"), strict=True):
                ax.plot(points.tokens, points[metric] * 100, "o-" if kind != "hybrid" else "^",
                        color=KIND_COLORS[kind], label=kind)
        for ax, name in zip(axes, ("MFU (% of matmul peak)", "MBU (% of memory bandwidth)"), strict=True):
            log_scale(ax, "x")
            ax.set_xlabel("Tokens in the iteration (prefill + decode, log)")
            ax.set_ylabel(name)
            ax.set_ylim(bottom=0)
        axes[0].legend(frameon=False, title="iteration")
        first = frame.iloc[0]
        peak = f"peak {first['peak_flops'] / 1e12:.2f} TFLOP/s, {first['bandwidth'] / 1e9:.0f} GB/s"
        fig.suptitle(f"Utilisation: {title(frame)}; {peak}", fontsize=10)
        return finish(fig, save)


def chunking_plot(frame: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Chunked prefill time / unchunked prefill time, prompt length x chunk size."""
    grid = chunking_overhead(frame) if (frame.kind == "chunk").any() else pd.DataFrame()
    if grid.empty:
        return message("No chunked prefills (stallfree-bench +experiment=chunking).", save)
    with style():
        fig = Figure(figsize=(1.3 * grid.shape[1] + 3, 0.7 * grid.shape[0] + 2), layout="constrained")
        ax = fig.subplots()
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="rocket_r", vmin=1.0, ax=ax,
                    cbar_kws={"label": "prefill time / unchunked (x)"})
        ax.set_xlabel("Chunk size (tokens; = prompt length: unchunked)")
        ax.set_ylabel("Prompt length (tokens)")
        ax.set_title(f"Chunking overhead: {title(frame)}", fontsize=10)
        return finish(fig, save)


def tiles_plot(frame: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Iteration time of prefill-only chunks stepped finely across tile boundaries, one panel per region."""
    tiles = shape_medians(frame, "tile", ["chunk_size"])
    if tiles.empty:
        return message("No tile steps (stallfree-bench +experiment=tiles).", save)
    sizes = tiles.chunk_size.to_numpy()
    regions = np.split(np.arange(len(sizes)), np.where(np.diff(sizes) > 32)[0] + 1)
    with style():
        fig = Figure(figsize=(3.6 * len(regions) + 1, 3.8), layout="constrained")
        axes = np.atleast_1d(fig.subplots(1, len(regions)))
        for ax, index in zip(axes, regions, strict=True):
            part = tiles.iloc[index]
            ax.plot(part.chunk_size, part.iteration_s * 1e3, "o-", drawstyle="steps-mid", color=KIND_COLORS["prefill"])
            for boundary in range(0, int(part.chunk_size.max()) + 1, 128):
                if part.chunk_size.min() <= boundary:
                    ax.axvline(boundary, color="0.5", ls=":", lw=1)
            ax.set_xlabel("Chunk size (tokens)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[0].set_ylabel("Iteration time (ms)")
        fig.suptitle(f"Tile steps (dotted: multiples of 128 tokens): {title(frame)}", fontsize=10)
        return finish(fig, save)
