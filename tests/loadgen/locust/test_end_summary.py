"""A headless Locust run (a subprocess: Locust monkeypatches with gevent on import, so it is never imported here) ends with the LLM statistics of the whole run (TTFT / TBT p50, p90, p99, output
tokens/s, SLO attainment) on stdout, after Locust's own summary, and in its --html report: what the web UI's
LLM tab shows, for a user who reads the terminal. Against the FAKE SSE server (tests/helpers/fakes), whose
TTFT and TBT are known."""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers.fakes.fake_sse_server import running_fake_server
from tests.helpers.locust import llm_stats, locust_command

TTFT_MS, TBT_MS = 40.0, 10.0
TITLE, SECTION = "LLM statistics, whole run", '<section id="stallfree-llm-summary"'  # loadgen.locust.end_summary


@pytest.fixture(scope="module")
def headless_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("locust")
    with running_fake_server(ttft_ms=TTFT_MS, tbt_ms=TBT_MS) as url:
        proc = subprocess.run(locust_command(url, "--headless", "-t", "4s", "--only-summary", "--csv", str(out / "locust"),
                                             "--html", str(out / "report.html"), "OpenLoopUser", "--qps", "5",
                                             "--prompt-len", "8", "--max-tokens", "8", "--slo-tbt-ms", "1000", "--model", "fake"),
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr, (out / "report.html").read_text(encoding="utf-8"), llm_stats(out)[1]


def _row(text: str, name: str) -> list[float]:
    """The three percentiles on the table's line of ``name``."""
    [line] = [line for line in text.splitlines() if re.match(rf"\s*{name}\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$", line)]
    return [float(value) for value in line.split()[1:]]


def test_stdout_ends_with_the_llm_statistics(headless_run):
    text, _, run = headless_run
    summary = text[text.index(TITLE):]
    assert "Response time percentiles" in text[:text.index(TITLE)]  # after Locust's own tables
    ttft, tbt = _row(summary, "TTFT"), _row(summary, "TBT")
    assert ttft == [run["ttft_p50_ms"], run["ttft_p90_ms"], run["ttft_p99_ms"]]  # the LLM tab's figures
    assert tbt == [run["tbt_p50_ms"], run["tbt_p90_ms"], run["tbt_p99_ms"]]
    assert TTFT_MS <= ttft[0] <= ttft[1] <= ttft[2] and TBT_MS * 0.9 <= tbt[0] <= tbt[1] <= tbt[2]
    assert f"output tokens/s: {run['output_tokens_per_s']:g}" in summary and run["output_tokens_per_s"] > 0
    assert f"SLO met % (TBT ≤ 1000 ms): {run['slo_met_pct']:g}" in summary


def test_the_html_report_holds_them(headless_run):
    text, report, run = headless_run
    section = report[report.index(SECTION):]
    assert section.index("</section>") < section.index("</body>")  # inside the page's body
    for name in ("ttft", "tbt"):
        cells = "".join(f"<td>{run[f'{name}_p{q}_ms']:g}</td>" for q in (50, 90, 99))
        assert f"<td>{name.upper()}</td>{cells}" in section
    assert "output tokens/s" in section and "SLO met % (TBT ≤ 1000 ms)" in section
