"""The LLM statistics of the whole run at the end of a Locust run, for a user who reads the terminal or
the report rather than the web UI's LLM tab: TTFT and TBT p50 / p90 / p99, output tokens/s and SLO
attainment, printed after Locust's own summary (its ``quit`` event, on the stats logger Locust prints its
tables with) and added to the --html report Locust writes (its ``quitting`` event, which comes after the
report is written; Locust has no hook for content of its own in that report). Imported only inside a
Locust process.
"""
from __future__ import annotations

import html
import os
from collections.abc import Callable

from locust.env import Environment
from locust.stats import console_logger

from stallfree.loadgen.locust.llm_stats import LLMStats, SLOBounds, slo_label

TITLE = "LLM statistics, whole run"
PERCENTILES = (50, 90, 99)
SECTION_ID = "stallfree-llm-summary"


def _value(value: float | int | str) -> str:
    return "-" if value == "" else f"{value:g}" if isinstance(value, float) else str(value)


def percentile_table(row: dict) -> list[list[str]]:
    """A header, then TTFT and TBT: their p50 / p90 / p99 in ms ("-" when no request got so far)."""
    return [["", *(f"p{q} (ms)" for q in PERCENTILES)],
            *([name, *(_value(row[f"{name.lower()}_p{q}_ms"]) for q in PERCENTILES)] for name in ("TTFT", "TBT"))]


def facts(row: dict, slo: SLOBounds) -> list[tuple[str, str]]:
    return [("output tokens/s", _value(row["output_tokens_per_s"])), (slo_label(slo), _value(row["slo_met_pct"])),
            ("requests ended / failed / cancelled at stop",
             f"{row['ended']} / {row['failed']} / {row['cancelled_at_stop']}")]


def text_lines(row: dict, slo: SLOBounds) -> list[str]:
    table = percentile_table(row)
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = [f"{TITLE} (TTFT from the intended send time, TBT every gap between two tokens)"]
    lines += ["  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(line, widths, strict=True))) for line in table]
    return [*lines, *(f"{label}: {value}" for label, value in facts(row, slo))]


def _cells(tag: str, line: list[str]) -> str:
    return "".join(f"<{tag}>{html.escape(cell)}</{tag}>" for cell in line)


def html_section(row: dict, slo: SLOBounds) -> str:
    header, *body = percentile_table(row)
    rows = "".join(f"<tr>{_cells('td', line)}</tr>" for line in body)
    items = "".join(f"<li>{html.escape(label)}: {html.escape(value)}</li>" for label, value in facts(row, slo))
    return (f'<section id="{SECTION_ID}" style="font-family: sans-serif; max-width: 1200px; margin: 2em auto">'
            f"<h2>{TITLE}</h2><table><thead><tr>{_cells('th', header)}</tr></thead><tbody>{rows}</tbody></table>"
            f"<ul>{items}</ul></section>")


def add_to_report(path: str, section: str) -> None:
    """Insert ``section`` at the end of the body of the HTML report at ``path``."""
    with open(path, encoding="utf-8") as f:
        page = f.read()
    before, body_end, after = page.rpartition("</body>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{before}{section}{body_end}{after}" if body_end else page + section)


def install(environment: Environment, stats: LLMStats, refresh: Callable[[], None]) -> None:
    """On a master or standalone process: the summary ends Locust's stdout summary and its --html report."""
    options = environment.parsed_options

    def on_quitting(**_) -> None:
        if options.html_file and os.path.isfile(options.html_file):  # written just before, unless SIGTERM
            refresh()
            add_to_report(options.html_file, html_section(stats.whole_run(), stats.slo))

    def on_quit(**_) -> None:
        if not (options.json or options.json_file):  # Locust's own summary is printed in the same case
            refresh()
            for line in text_lines(stats.whole_run(), stats.slo):
                console_logger.info(line)
            console_logger.info("")
    environment.events.quitting.add_listener(on_quitting)
    environment.events.quit.add_listener(on_quit)
