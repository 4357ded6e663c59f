"""The look shared by the report's figures: seaborn's style, plain log-axis labels, a message in place of
a figure, and saving at one resolution."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

DPI = 120


def log_scale(ax: Axes, which: str) -> None:
    """Log scale on axis `which` ("x" / "y") with plain tick labels at 1, 2, 5 x 10^k, and at the
    minor ticks too while the view spans under 0.8 decades (else a narrow range shows one label)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")

    def minor_label(value: float, _: int) -> str:
        low, high = axis.get_view_interval()
        return f"{value:g}" if np.log10(high / low) < 0.8 else ""

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor_label))


def message(text: str, save: str | Path | None) -> Figure:
    fig = Figure(figsize=(7, 1.6))
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, color="0.3", wrap=True)
    return finish(fig, save)


def finish(fig: Figure, save: str | Path | None) -> Figure:
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, dpi=DPI)
    return fig


@contextmanager
def style() -> Iterator[None]:
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.9):
        yield
