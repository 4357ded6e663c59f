"""The report end to end: a short real sweep on `tiny` (stallfree-bench), then every notebook on it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stallfree.analysis import report
from tests.helpers.notebooks import FIGURES, check_executed_notebook

pytestmark = pytest.mark.slow  # a real sweep, then every notebook on it

BENCH = Path(sys.executable).parent / "stallfree-bench"


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    args = ["-m", "scheduler=vllm,sarathi", "scheduler.chunk_size=32,64", "qps=4,16", "workload=fixed",
            "workload.lengths.prompt=96", "workload.lengths.output=12", "num_requests=12",
            "experiment_name=e2e", f"results_dir={root}"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([BENCH, *args], cwd=root, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("[done]") == 6  # vllm ignores chunk_size: 2 + 4 runs
    assert report.main([str(root / "e2e")]) == 0
    return root / "e2e"


@pytest.mark.parametrize("name", list(FIGURES))
def test_notebook_runs_on_a_real_sweep(swept, name):
    check_executed_notebook(swept, name)


def test_report_html_has_the_three_sections(swept):
    html = (swept / "report.html").read_text()
    for title in (report.SECTIONS[name] for name in report.GENERIC_SECTIONS):
        assert title in html


def test_report_opens_with_a_conclusion_from_the_data(swept):
    html = (swept / "report.html").read_text()
    assert html.index('id="Conclusion"') < html.index('id="Pareto-frontiers"')
    text = (swept / "conclusion.md").read_text()
    assert "SLO (P99 TBT ≤" in text and "from the sweep's runs (no capacity search ran)" in text
    assert "Ranking: " in text and not re.search(r"\bnan\b", text, re.IGNORECASE)
