"""loadgen/locustfile.py and target=locust: Locust runs as `locust` subprocesses (it monkeypatches with
gevent on import, so it is never imported here) against an in-process tiny stallfree-serve or the fake
SSE server (tests/fakes/fake_sse_server.py), all on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from engine.server import start_server
from loadgen.metrics import summarize
from loadgen.results import requests_frame
from loadgen.targets.locust_run import read_records
from tests.fakes.fake_sse_server import running_fake_server

ROOT = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).with_name("locust")
LOCUSTFILE = ROOT / "loadgen" / "locustfile.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SMALL = ["--prompt-len", "32", "--max-tokens", "16"]


@pytest.fixture(scope="module")
def tiny_url():
    with start_server({"model": "tiny", "dtype": "float32"}) as server:
        yield server.url


@pytest.fixture(scope="module")
def fake_url():
    with running_fake_server(ttft_ms=20, tbt_ms=5) as url:
        yield url


@pytest.fixture(scope="module")
def slow_url():
    with running_fake_server(ttft_ms=1000, tbt_ms=20) as url:
        yield url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locust_command(host: str, *args: str) -> list[str]:
    return [str(LOCUST), "-f", str(LOCUSTFILE), "--host", host, "--loglevel", "WARNING", *args]


def run_headless(host: str, out: Path, *args: str) -> list[dict]:
    """A headless run writing its CSV to out/locust_*.csv; returns its raw rows."""
    command = locust_command(host, "--headless", "--only-summary", "--exit-code-on-error", "0", "--csv", str(out / "locust"),
                             "--rows-dir", str(out / "rows"), *args)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_records(out / "rows")


def locust_stats(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "locust_stats.csv").set_index("Name")


def test_headless_run_against_tiny_server(tiny_url, tmp_path):
    rows = run_headless(tiny_url, tmp_path, "OpenLoopUser", "--qps", "4", "--num-requests", "40", *SMALL)
    df = requests_frame(rows)
    assert len(df) == 40 and (df["status"] == "ok").all() and (df["output_tokens"] == 16).all()
    table = locust_stats(tmp_path)
    assert (table.loc[["E2E", "TTFT", "TBT", "output_tokens"], "Type"] == "LLM").all()
    assert table.loc["E2E", "Request Count"] == table.loc["TTFT", "Request Count"] == len(rows)
    assert table.loc["TBT", "Request Count"] == 15 * len(rows)
    # Locust's averages are of the same full-precision values as the raw rows
    ttft_ms = (df["first_token_time"] - df["intended_send_time"]) * 1e3
    assert table.loc["TTFT", "Average Response Time"] == pytest.approx(ttft_ms.mean(), abs=1e-6)
    # the client's TTFT (from its send) agrees with the server's (from its arrival) within a few ms
    client_ms = (df["first_token_time"] - df["send_time"]) * 1e3
    server_ms = (df["server_token_times"].str[0] - df["server_arrival_time"]) * 1e3
    excess = client_ms - server_ms
    assert (excess > 0).all() and excess.median() < 5 and excess.quantile(0.9) < 10, excess.describe()


def test_open_loop_arrivals_are_poisson_and_ignore_slow_responses(slow_url, tmp_path):
    qps = 25
    rows = run_headless(slow_url, tmp_path, "OpenLoopUser", "--qps", str(qps), "--num-requests", "200",
                        "--model", "fake", *SMALL)
    df = requests_frame(rows)
    assert len(df) == 200 and (df["status"] == "ok").all()
    gaps = np.diff(np.sort(df["send_time"]))
    assert stats.kstest(gaps, "expon", args=(0, 1 / qps)).pvalue > 0.01
    # every response takes over a second, yet requests go out on schedule, many in flight at once
    summary = summarize(df)
    assert summary["achieved_rate"] == pytest.approx(summary["offered_rate"], rel=0.02)
    assert summary["schedule_lag_p99_ms"] < 25, summary
    sends = np.sort(df["send_time"])
    sent_meanwhile = np.searchsorted(sends, df["finish_time"]) - np.searchsorted(sends, df["send_time"], "right")
    assert np.median(sent_meanwhile) >= 15  # a closed loop would send none


@pytest.mark.parametrize("args, status, error", [
    (["--model", "fake-status-500"], "error", "HTTP 500: "),
    (["--model", "fake", "--request-timeout", "0.3"], "timeout", "no complete response within 0.3 s"),
])
def test_failures_become_rows_and_e2e_failures(slow_url, tmp_path, args, status, error):
    rows = run_headless(slow_url, tmp_path, "OpenLoopUser", "--qps", "20", "--num-requests", "5", *args, *SMALL)
    assert [row.status for row in rows] == [status] * 5
    assert all(row.error.startswith(error) for row in rows)
    assert locust_stats(tmp_path).loc["E2E", "Failure Count"] == 5


def test_in_flight_cap_drops_and_counts(slow_url, tmp_path):
    rows = run_headless(slow_url, tmp_path, "OpenLoopUser", "--qps", "50", "--num-requests", "30",
                        "--max-in-flight", "3", "--model", "fake", *SMALL)
    df = requests_frame(rows)
    dropped = df["error"].str.startswith("dropped", na=False)
    assert len(df) == 30 and dropped.sum() > 10 and (df.loc[~dropped, "status"] == "ok").all()
    assert (df.loc[dropped, "status"] == "aborted").all()
    table = locust_stats(tmp_path)
    assert table.loc["dropped", "Failure Count"] == dropped.sum()
    assert table.loc["E2E", "Request Count"] == (~dropped).sum()


def test_step_shape_steps_the_rate(fake_url, tmp_path):
    rows = run_headless(fake_url, tmp_path, "OpenLoopUser", "--step-qps", "4,40", "--step-seconds", "2.5",
                        "--model", "fake", *SMALL)
    sent = np.array([row.intended_send_time for row in rows])
    first = (sent < sent.min() + 2.5).sum()
    assert 1 <= first <= 25 and 50 <= len(rows) - first <= 160, (first, len(rows))


def test_distributed_master_and_two_workers(fake_url, tmp_path):
    port = free_port()
    master = subprocess.Popen(
        locust_command(fake_url, "OpenLoopUser", "--master", "--headless", "--only-summary", "--expect-workers", "2",
                       "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port), "-u", "2", "-r", "2",
                       "--csv", str(tmp_path / "locust"), "--rows-dir", str(tmp_path / "rows"), "--qps", "20",
                       "--num-requests", "60", "--model", "fake", *SMALL),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers = [subprocess.Popen(locust_command(fake_url, "OpenLoopUser", "--worker", "--master-host", "127.0.0.1",
                                               "--master-port", str(port)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        output, _ = master.communicate(timeout=120)
        assert master.returncode == 0, output[-3000:]
        for worker in workers:
            assert worker.wait(timeout=30) == 0
    finally:
        for proc in (master, *workers):
            proc.kill()
    files = sorted((tmp_path / "rows").glob("rows-worker*.jsonl"))
    per_worker = [len(path.read_text().splitlines()) for path in files]
    assert per_worker == [30, 30]
    rows = read_records(tmp_path / "rows")
    assert {row.request_id[:3] for row in rows} == {"p0-", "p1-"}  # each worker its own schedule
    assert locust_stats(tmp_path).loc["E2E", "Request Count"] == sum(per_worker)


def test_bench_target_locust(tiny_url, tmp_path):
    command = [str(Path(sys.executable).with_name("stallfree-bench")), "target=locust", f"target.url={tiny_url}",
               "workload=fixed", "num_requests=8", "qps=4", "slo.tbt_ms=1000", f"results_dir={tmp_path}",
               "experiment_name=locust"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "locust").iterdir() if p.is_dir() and not p.name.startswith(".")]
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(requests) == 8 and (requests["status"] == "ok").all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target"] == "locust" and summary["completed"] == 8
    assert locust_stats(run_dir / "locust").loc["E2E", "Request Count"] == 8
    assert (run_dir / "locust" / "locust.html").is_file()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium (apt-get install chromium)")
def test_web_ui_shows_llm_rows(tiny_url):
    from playwright.sync_api import sync_playwright

    web = f"http://127.0.0.1:{free_port()}"
    port = web.rsplit(":", 1)[1]
    ui = subprocess.Popen(locust_command(tiny_url, "LLMUser", "--web-host", "127.0.0.1", "--web-port", port, *SMALL),
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(web, timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and ui.poll() is None, "the Locust web UI did not start"
                time.sleep(0.2)
        swarm = httpx.post(f"{web}/swarm", data={"user_count": 2, "spawn_rate": 2}, trust_env=False)
        assert swarm.json()["success"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 700})
            page.goto(web)
            for name in ("TTFT", "TBT", "E2E", "output_tokens"):
                page.get_by_role("cell", name=name, exact=True).wait_for(timeout=30_000)
            if path := os.environ.get("STALLFREE_LOCUST_SCREENSHOT"):
                page.wait_for_timeout(5000)  # a few seconds of statistics
                page.screenshot(path=path)
            browser.close()
    finally:
        ui.terminate()
        ui.wait(timeout=30)
