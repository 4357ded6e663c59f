"""`stallfree-report RESULTS_DIR`: execute the analysis notebooks on a results set and render one HTML
report (RESULTS_DIR/report.html, code hidden) that opens with its conclusion (analysis.conclusion, also
RESULTS_DIR/conclusion.md), PNG figures (RESULTS_DIR/figures/) and the executed notebooks
(RESULTS_DIR/notebooks/)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import papermill
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbconvert import HTMLExporter
from traitlets import default

from stallfree.analysis.capacity import slo_levels
from stallfree.analysis.conclusion import conclusion_markdown, paper_conclusion
from stallfree.analysis.load import load_batches, load_runs
from stallfree.analysis.paper import capacity_table
from stallfree.analysis.phases import find_phases
from stallfree.analysis.prefix_study import has_prefix_study
from stallfree.analysis.vllm_format import export_vllm
from stallfree.engine.records.writable import ResultsDirError, probe_writable, results_dir_error

NOTEBOOK_DIR = Path(__file__).parent / "notebooks"
SECTIONS = {"pareto": "Pareto frontiers", "capacity": "Capacity", "stalls": "Generation stalls",
            "paper": "The Sarathi-Serve study on simulated GPU deployments", "compare": "Engines side by side"}
OPTIONAL_SECTIONS = {"paper", "compare"}  # only for results that hold them (analysis.paper, analysis.compare)
COMPARE_SECTIONS = ["compare"]  # an engine comparison's report, in order (+experiment=compare)
GENERIC_SECTIONS = [name for name in SECTIONS if name not in OPTIONAL_SECTIONS]
PHASES = "phases"  # the characterisation studies: included when a phases.csv is there


class ThisPythonKernelManager(AsyncKernelManager):
    """Starts the notebooks' `python3` kernel with this interpreter (sys.executable), so a fresh venv
    needs no `ipykernel install` and user- or system-wide kernel specs cannot point elsewhere. Talks
    to it over IPC sockets (local, no unencrypted TCP ports)."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])  # no spec dirs: falls back to ipykernel's own spec


def _papermill(source: Path, output: Path, parameters: dict[str, Any]) -> None:
    papermill.execute_notebook(
        source, output, parameters=parameters,
        kernel_name="python3", kernel_manager_class=ThisPythonKernelManager, progress_bar=False,
        # cell errors still fail the run; this only mutes the kernel's own log, which reports the
        # interrupt jupyter_client sends at every shutdown as "KeyboardInterrupt caught in kernel"
        extra_arguments=["--IPKernelApp.log_level=CRITICAL"])


def execute_notebook(name: str, results_dir: str | Path, output_dir: str | Path, **parameters: Any) -> Path:
    """Runs analysis/notebooks/<name>.ipynb with papermill (`results_dir` plus `parameters`) and
    returns the executed copy, OUTPUT_DIR/<name>.ipynb. Raises papermill.PapermillExecutionError."""
    output = Path(output_dir) / f"{name}.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    _papermill(NOTEBOOK_DIR / f"{name}.ipynb", output,
               {"results_dir": str(Path(results_dir).resolve()), **parameters})
    return output


def refresh_notebooks() -> None:
    """Re-executes analysis/notebooks/*.ipynb in place on their default `results_dir`
    (results/example, the small checked-in set), so the notebooks in git carry real outputs."""
    for name in [*GENERIC_SECTIONS, PHASES]:
        _papermill(NOTEBOOK_DIR / f"{name}.ipynb", NOTEBOOK_DIR / f"{name}.ipynb", {})


def render_html(notebooks: list[Path], output: str | Path, title: str, conclusion: str = "") -> Path:
    """One HTML page: the conclusion (markdown), then the executed notebooks in order, without code cells'
    input or stderr."""
    executed = [nbformat.read(path, as_version=4) for path in notebooks]
    cells = [nbformat.v4.new_markdown_cell(f"*{title}*")]
    if conclusion:
        cells.append(nbformat.v4.new_markdown_cell(conclusion))
    for notebook in executed:
        for cell in notebook.cells:
            if cell.cell_type == "code":
                cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
            cells.append(cell)
    merged = nbformat.v4.new_notebook(cells=cells, metadata=executed[0].metadata)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    html, _ = exporter.from_notebook_node(merged, resources={"metadata": {"name": title}})
    Path(output).write_text(html, encoding="utf-8")
    return Path(output)


def has_section_data(name: str, results_dir: Path) -> bool:
    """Whether an optional section has anything to show in RESULTS_DIR."""
    if name == "compare":
        return any(results_dir.glob("compare.json")) or any(results_dir.glob("*/compare.json"))
    return name == "paper" and not capacity_table(results_dir).empty


def write_conclusion(results_dir: Path, paper_study: bool, slo_tbt_ms: float | None,
                     relaxed_slo_tbt_ms: float | None) -> str:
    """RESULTS_DIR/conclusion.md (analysis.conclusion); returns its markdown."""
    runs = load_runs(results_dir)
    if paper_study:
        text = paper_conclusion(results_dir)
    elif runs.empty:
        text = "# Conclusion\n\nNo load-test runs here: this report holds the characterisation studies alone."
    else:
        text = conclusion_markdown(results_dir, runs, slo_levels(runs, load_batches(runs), slo_tbt_ms,
                                                                  relaxed_slo_tbt_ms))
    (results_dir / "conclusion.md").write_text(text + "\n", encoding="utf-8")
    return text


def build_report(results_dir: str | Path, slo_tbt_ms: float | None = None,
                 relaxed_slo_tbt_ms: float | None = None, qps: float | None = None) -> Path:
    """Executes every notebook of `SECTIONS` on RESULTS_DIR (when it holds runs) and the phases notebook (when
    it holds a phases.csv), and writes RESULTS_DIR/report.html, opening with RESULTS_DIR/conclusion.md."""
    results_dir = Path(results_dir)
    figures_dir = str((results_dir / "figures").resolve())
    common = {"slo_tbt_ms": slo_tbt_ms, "relaxed_slo_tbt_ms": relaxed_slo_tbt_ms, "figures_dir": figures_dir}
    extra = {"stalls": {"qps": qps}}
    # The paper study's results mix deployments and traces, which the generic sections (one model and
    # workload, policies side by side) cannot tell apart: they get the paper section alone.
    phases_csv = find_phases(results_dir)
    # a prefix-caching study on a simulated deployment compares caching off and on: not the paper's study
    paper_study = has_section_data("paper", results_dir) and not has_prefix_study(results_dir)
    if paper_study:
        sections = [(name, results_dir, {}) for name in ["paper"]]
    elif has_section_data("compare", results_dir):  # engines side by side: policies' sections do not apply
        sections = [(name, results_dir, {}) for name in COMPARE_SECTIONS]
    elif phases_csv is None or not load_runs(results_dir).empty:
        sections = [(name, results_dir, extra.get(name, {})) for name in GENERIC_SECTIONS]
    else:
        sections = []
    if phases_csv is not None:
        sections.append((PHASES, phases_csv.parent, {}))
    executed = []
    for i, (name, data_dir, knobs) in enumerate(sections, 1):
        print(f"[{i}/{len(sections)}] {SECTIONS.get(name, 'Characterisation studies')} ({name}.ipynb) ...", end=" ",
              flush=True)
        started = time.monotonic()
        params = {"slo_tbt_ms": slo_tbt_ms, "figures_dir": figures_dir} if name == PHASES else {**common, **knobs}
        executed.append(execute_notebook(name, data_dir, results_dir / "notebooks", **params))
        print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    conclusion = write_conclusion(results_dir, paper_study, slo_tbt_ms, relaxed_slo_tbt_ms)
    return render_html(executed, results_dir / "report.html", f"stallfree report: {results_dir}", conclusion)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stallfree-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", type=Path, help="a results root (results/) or one experiment dir")
    parser.add_argument("--slo-tbt-ms", type=float, help="strict TBT SLO (ms); default 5x decode iteration")
    parser.add_argument("--relaxed-slo-tbt-ms", type=float, help="relaxed TBT SLO (ms); default 25x")
    parser.add_argument("--qps", type=float, help="QPS of the runs in the stall timeline")
    parser.add_argument("--export", choices=["vllm"], help="instead of the report, write each run as vLLM's "
                        "bench serve --save-result JSON (to --out, default RESULTS_DIR/vllm/)")
    parser.add_argument("--out", type=Path, help="--export: the output directory")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"stallfree-report: error: results directory not found: {args.results_dir}", file=sys.stderr)
        return 2
    if load_runs(args.results_dir).empty and (args.export or find_phases(args.results_dir) is None):
        print(f"stallfree-report: error: no runs under {args.results_dir} (a run directory holds summary.json, "
              "a studies run phases.csv; run stallfree-bench first, or give the results_dir it wrote to)",
              file=sys.stderr)
        return 2
    output_dir = (args.out or args.results_dir / "vllm") if args.export else args.results_dir
    try:
        probe_writable(output_dir)
        if args.export:
            written = export_vllm(load_runs(args.results_dir), output_dir)
            print(f"exported {len(written)} runs to {output_dir}/")
            return 0
        report = build_report(args.results_dir, slo_tbt_ms=args.slo_tbt_ms,
                              relaxed_slo_tbt_ms=args.relaxed_slo_tbt_ms, qps=args.qps)
    except KeyboardInterrupt:
        print("\nstallfree-report: interrupted; no report written", file=sys.stderr)
        return 130
    except papermill.PapermillExecutionError as err:
        print(f"stallfree-report: error: a notebook failed: {err.ename}: {err.evalue}\n"
              f"  see the executed notebooks in {args.results_dir / 'notebooks'}", file=sys.stderr)
        return 1
    except (ResultsDirError, OSError) as err:
        unwritable = err if isinstance(err, ResultsDirError) else results_dir_error(err, output_dir)
        if unwritable is None:
            raise
        print(f"stallfree-report: error: {unwritable}", file=sys.stderr)
        return 2
    figures = sorted((args.results_dir / "figures").glob("*.png"))
    print(f"report:  {report}\nfigures: {args.results_dir / 'figures'}/ ({len(figures)} PNG)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
