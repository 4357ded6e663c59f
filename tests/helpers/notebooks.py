"""What an executed report notebook must show: no error output, its figures inline and saved as PNG."""
from __future__ import annotations

from pathlib import Path

import nbformat

FIGURES = {"pareto": ["pareto_p99_tbt.png", "pareto_p50_ttft.png", "pareto_p99_ttft.png"],
           "capacity": ["capacity.png"], "stalls": ["stall_timeline.png"]}
# the phases notebook's (stallfree-report adds it only where a phases.csv is)
PHASES_FIGURES = ["phases_per_token.png", "phases_split.png", "phases_utilisation.png", "phases_chunking.png",
                  "phases_tiles.png"]


def check_executed_notebook(report_dir: Path, name: str) -> None:
    """The executed notebook has no error output, shows its figures and saved them as PNG."""
    notebook = nbformat.read(report_dir / "notebooks" / f"{name}.ipynb", as_version=4)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = PHASES_FIGURES if name == "phases" else FIGURES[name]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(figures)
    for figure in figures:
        assert (report_dir / "figures" / figure).stat().st_size > 10_000
