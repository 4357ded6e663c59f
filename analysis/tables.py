"""Tables in the report: no pandas index, no <NA> (an empty cell: "–"), and a horizontal scroll bar for a
table wider than the page, instead of one that runs off it. A section without rows is left out of the
report, with one line saying why."""
from __future__ import annotations

import pandas as pd
from IPython.display import HTML, Markdown

MISSING = "–"


def show(table: pd.DataFrame) -> HTML:
    """``table`` as HTML for a notebook cell's output (and so the report)."""
    cells = table.astype(object).where(table.notna(), MISSING)  # na_rep misses the nullable dtypes' <NA>
    html = cells.to_html(index=False, border=0, classes="dataframe stallfree-table")
    return HTML(f'<div style="overflow-x: auto; max-width: 100%">{html}</div>')


def section(title: str, table: pd.DataFrame, why_empty: str, intro: str = "") -> list[Markdown | HTML]:
    """A report section for ``display(*section(...))``: its heading, ``intro`` and table; without rows, only
    one line saying that it is left out and why (``why_empty``)."""
    if table.empty:
        return [Markdown(f"*{title}: left out, {why_empty}.*")]
    return [Markdown(f"## {title}\n\n{intro}".strip()), show(table)]
