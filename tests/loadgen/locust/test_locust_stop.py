"""A Locust test cut off by its stop (-t, Stop): the requests in flight are "cancelled at stop", not
failures, and every count Locust and the LLM tab write agrees."""
from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from stallfree.loadgen.locust.target import read_records
from tests.helpers.fakes.fake_sse_server import running_fake_server
from tests.helpers.locust import llm_stats, locust_command, locust_stats


@pytest.fixture(scope="module")
def fake_url():
    with running_fake_server(ttft_ms=20, tbt_ms=5) as url:
        yield url


@pytest.mark.slow
def test_a_timed_run_cancels_at_stop_exits_0_and_every_count_agrees(fake_url, tmp_path):
    """-t cuts off the requests in flight: they are "cancelled at stop", not failures (exit code 0 under
    Locust's default --exit-code-on-error 1); Locust's CSV, HTML report and stdout and the LLM CSV agree."""
    command = locust_command(fake_url, "--headless", "--only-summary", "-t", "5s", "--csv", str(tmp_path / "locust"),
                             "--html", str(tmp_path / "locust.html"), "--rows-dir", str(tmp_path / "rows"),
                             "OpenLoopUser", "--qps", "10", "--model", "fake", "--prompt-len", "32",
                             "--max-tokens", "200")  # 1 s per request: about 10 in flight at the stop
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = read_records(tmp_path / "rows")
    cancelled = [r for r in rows if r.error == "cancelled at stop"]
    ended = [r for r in rows if r.error != "cancelled at stop"]
    assert cancelled and ended and all(r.status == "ok" for r in ended)
    table = locust_stats(tmp_path)
    assert table.loc["Aggregated", "Request Count"] == len(ended) and table.loc["Aggregated", "Failure Count"] == 0
    _, run = llm_stats(tmp_path)
    assert (run["ended"], run["failed"], run["cancelled_at_stop"]) == (len(ended), 0, len(cancelled))
    history = pd.read_csv(tmp_path / "locust_stats_history.csv").iloc[-1]
    assert history["Total Request Count"] == len(ended) and history["Total Failure Count"] == 0
    summary = re.search(r"^\s*Aggregated\s+(\d+)\s+(\d+)\(", proc.stdout + proc.stderr, re.MULTILINE)
    assert summary and (int(summary[1]), int(summary[2])) == (len(ended), 0)
    html = (tmp_path / "locust.html").read_text()
    assert re.search(rf'"num_requests":\s*{len(ended)}\b', html) and re.search(r'"num_failures":\s*0\b', html)
