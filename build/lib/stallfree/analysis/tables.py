"""Tables in the report: no pandas index, no <NA> (an empty cell: "–"), and a horizontal scroll bar for a
table wider than the page, instead of one that runs off it."""
from __future__ import annotations

import pandas as pd
from IPython.display import HTML

MISSING = "–"


def show(table: pd.DataFrame) -> HTML:
    """``table`` as HTML for a notebook cell's output (and so the report)."""
    cells = table.astype(object).where(table.notna(), MISSING)  # na_rep misses the nullable dtypes' <NA>
    html = cells.to_html(index=False, border=0, classes="dataframe stallfree-table")
    return HTML(f'<div style="overflow-x: auto; max-width: 100%">{html}</div>')
