"""loadgen/locust/locustfile.py and target=locust: Locust runs as `locust` subprocesses (it monkeypatches with
gevent on import, so it is never imported here) against an in-process tiny stallfree-serve or the fake
SSE server (tests/helpers/fakes/fake_sse_server.py), all on 127.0.0.1.
"""
from __future__ import annotations

import itertools
import json
import re
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

from stallfree.engine.records.request_metrics import request_metrics, summarize
from stallfree.engine.server import start_server
from stallfree.loadgen.locust.target import read_records
from stallfree.loadgen.results.run_dir import requests_frame
from tests.helpers.fakes.fake_sse_server import running_fake_server
from tests.helpers.locust import llm_stats, locust_command, locust_stats
from tests.helpers.machine_stalls import retry_while_stalled

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


def run_headless(host: str, out: Path, *args: str) -> list[dict]:
    """A headless run writing its CSV to out/locust_*.csv; returns its raw rows."""
    command = locust_command(host, "--headless", "--only-summary", "--exit-code-on-error", "0", "--csv", str(out / "locust"),
                             "--rows-dir", str(out / "rows"), *args)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_records(out / "rows")


def exact_percentile(values, q: float) -> float:
    return float(np.percentile(values, q, method="inverted_cdf"))  # nearest rank, as the LLM tab


@pytest.mark.slow
def test_headless_run_against_tiny_server(tiny_url, tmp_path):
    rows = run_headless(tiny_url, tmp_path, "OpenLoopUser", "--qps", "4", "--num-requests", "40",
                        "--slo-tbt-ms", "30", *SMALL)
    df = requests_frame(rows)
    assert len(df) == 40 and (df["status"] == "ok").all() and (df["output_tokens"] == 16).all()
    # one Locust request per completion, its response time the E2E: no per-token events
    table = locust_stats(tmp_path)
    assert list(table.index) == ["completions", "Aggregated"] and table.loc["completions", "Type"] == "LLM"
    assert table.loc["completions", "Request Count"] == 40 and table.loc["completions", "Average Content Size"] > 0
    e2e_ms = (df["finish_time"] - df["intended_send_time"]) * 1e3
    assert table.loc["completions", "Average Response Time"] == pytest.approx(e2e_ms.mean(), abs=1e-6)
    # the LLM tab's statistics: exact counts, percentiles within their 2 % bins, the SLO per request
    windows, run = llm_stats(tmp_path)
    assert run["name"] == "whole run" and run["ended"] == windows["ended"].sum() == 40
    assert run["output_tokens"] == windows["output_tokens"].sum() == 640 and run["in_flight"] == 0
    metrics = request_metrics(df)
    tbt_ms = np.concatenate(metrics["tbt_ms"].to_list())
    for column, values, q in [("ttft_p50_ms", metrics["ttft_ms"], 50), ("ttft_p99_ms", metrics["ttft_ms"], 99),
                              ("tbt_p50_ms", tbt_ms, 50), ("tbt_p99_ms", tbt_ms, 99)]:
        assert run[column] == pytest.approx(exact_percentile(values, q), rel=0.02, abs=0.1), column
    assert run["slo_met_pct"] == pytest.approx(100 * (metrics["max_tbt_ms"] <= 30).mean(), abs=0.05)
    # the client's TTFT (from its send) agrees with the server's (from its arrival) within a few ms (a
    # busy 2-core machine adds a few more: 5.7 ms median while a soak ran beside the suite)
    client_ms = (df["first_token_time"] - df["send_time"]) * 1e3
    server_ms = (df["server_token_times"].str[0] - df["server_arrival_time"]) * 1e3
    excess = client_ms - server_ms
    assert (excess > 0).all() and excess.median() < 10 and excess.quantile(0.9) < 20, excess.describe()


def test_slo_needing_a_decode_time_is_a_one_line_error():
    proc = subprocess.run(locust_command("http://127.0.0.1:9", "--headless", "OpenLoopUser", "--slo", "strict"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "locustfile: --slo strict bounds TBT at 5x the decode iteration time" in proc.stderr


@pytest.mark.slow
def test_open_loop_arrivals_are_poisson_and_ignore_slow_responses(slow_url, tmp_path):
    qps = 25

    attempt_dirs = (tmp_path / f"attempt{i}" for i in itertools.count())

    def attempt():
        out = next(attempt_dirs)
        out.mkdir()
        df = requests_frame(run_headless(slow_url, out, "OpenLoopUser", "--qps", str(qps), "--num-requests",
                                         "200", "--model", "fake", *SMALL))
        return df, summarize(df)

    (df, summary), stalls = retry_while_stalled(attempt, lambda result: result[1]["schedule_lag_p99_ms"] < 250)
    assert len(df) == 200 and (df["status"] == "ok").all()
    gaps = np.diff(np.sort(df["send_time"]))
    assert stats.kstest(gaps, "expon", args=(0, 1 / qps)).pvalue > 0.01
    # every response takes over a second, yet requests go out on schedule, many in flight at once
    assert summary["achieved_rate"] == pytest.approx(summary["offered_rate"], rel=0.1)
    assert summary["schedule_lag_p99_ms"] < 250, (stalls, summary)  # a closed loop would lag by seconds
    sends = np.sort(df["send_time"])
    sent_meanwhile = np.searchsorted(sends, df["finish_time"]) - np.searchsorted(sends, df["send_time"], "right")
    assert np.median(sent_meanwhile) >= 15  # a closed loop would send none


@pytest.mark.parametrize("args, status, error", [
    (["--model", "fake-status-500"], "error", "HTTP 500: "),
    (["--model", "fake", "--request-timeout", "0.3"], "timeout", "no complete response within 0.3 s"),
])
@pytest.mark.slow
def test_failures_become_rows_and_failed_requests(slow_url, tmp_path, args, status, error):
    rows = run_headless(slow_url, tmp_path, "OpenLoopUser", "--qps", "20", "--num-requests", "5", *args, *SMALL)
    assert [row.status for row in rows] == [status] * 5
    assert all(row.error.startswith(error) for row in rows)
    assert locust_stats(tmp_path).loc["completions", "Failure Count"] == 5
    _, run = llm_stats(tmp_path)
    assert run["ended"] == 5 and run["slo_met_pct"] == 0 and run["in_flight"] == 0


@pytest.mark.slow
def test_in_flight_cap_drops_and_counts(slow_url, tmp_path):
    rows = run_headless(slow_url, tmp_path, "OpenLoopUser", "--qps", "50", "--num-requests", "30",
                        "--max-in-flight", "3", "--model", "fake", *SMALL)
    df = requests_frame(rows)
    dropped = df["error"].str.startswith("dropped", na=False)
    assert len(df) == 30 and dropped.sum() > 10 and (df.loc[~dropped, "status"] == "ok").all()
    assert (df.loc[dropped, "status"] == "aborted").all()
    table = locust_stats(tmp_path)
    assert table.loc["dropped", "Failure Count"] == dropped.sum()
    assert table.loc["completions", "Request Count"] == (~dropped).sum()
    _, run = llm_stats(tmp_path)  # every arrival ends, dropped ones too; none stays in flight
    assert run["ended"] == 30 and run["in_flight"] == 0
    assert run["slo_met_pct"] == pytest.approx(100 * (~dropped).mean(), abs=0.05)  # no SLO given: ok


@pytest.mark.slow
def test_step_shape_steps_the_rate(fake_url, tmp_path):
    rows = run_headless(fake_url, tmp_path, "OpenLoopUser", "--step-qps", "4,40", "--step-seconds", "2.5",
                        "--model", "fake", *SMALL)
    sent = np.array([row.intended_send_time for row in rows])
    first = (sent < sent.min() + 2.5).sum()
    assert 1 <= first <= 25 and 50 <= len(rows) - first <= 160, (first, len(rows))


@pytest.mark.slow
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
    assert locust_stats(tmp_path).loc["completions", "Request Count"] == sum(per_worker)
    _, run = llm_stats(tmp_path)  # the workers' token events reach the master
    assert run["ended"] == 60 and run["output_tokens"] == 60 * 16 and run["in_flight"] == 0


@pytest.mark.slow
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
    assert summary["server_metrics"] == "stallfree" and summary["server_metrics_scrapes"] >= 1  # its /metrics
    assert not pd.read_parquet(run_dir / "server_metrics.parquet").empty
    assert locust_stats(run_dir / "locust").loc["completions", "Request Count"] == 8
    assert llm_stats(run_dir / "locust")[1]["ended"] == 8
    assert (run_dir / "locust" / "locust.html").is_file()


def start_web_ui(host: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A Locust web UI on a free port, once it answers: (its process, its URL)."""
    port = str(free_port())
    ui = subprocess.Popen(locust_command(host, "--web-host", "127.0.0.1", "--web-port", port, *args),
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    web = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(web, timeout=1, trust_env=False)
            return ui, web
        except httpx.TransportError:
            if time.monotonic() > deadline or ui.poll() is not None:
                ui.kill()
                raise AssertionError("the Locust web UI did not start") from None
            time.sleep(0.2)


def table_rows(page) -> dict[str, dict[str, str]]:
    """The shown table as {first cell: {column title: cell text}}."""
    titles = page.get_by_role("columnheader").all_inner_texts()
    rows = [row.get_by_role("cell").all_inner_texts() for row in page.get_by_role("row").all()]
    return {cells[0]: dict(zip(titles, cells, strict=True)) for cells in rows if len(cells) == len(titles)}


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium (apt-get install chromium)")
def test_web_ui_llm_tab_shows_live_token_statistics(tiny_url):
    """Statistics shows one row per request kind; the LLM tab fills with non-zero live numbers. (The
    screenshots in docs/ come from benchmarks/locust_screenshots.py, on a real model.)"""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[dev]')")
    ui, web = start_web_ui(tiny_url, "LLMUser", "--slo", "relaxed", "--decode-iter-ms", "40", *SMALL)
    try:
        swarm = httpx.post(f"{web}/swarm", data={"user_count": 2, "spawn_rate": 2}, trust_env=False)
        assert swarm.json()["success"]
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 560})
            page.goto(web)
            page.get_by_role("cell", name="completions", exact=True).wait_for(timeout=30_000)
            assert not {"TTFT", "TBT", "E2E", "output_tokens"} & set(table_rows(page))
            page.get_by_role("tab", name="LLM").click()
            page.get_by_role("cell", name="whole run", exact=True).wait_for(timeout=30_000)
            deadline = time.monotonic() + 60
            while float((run := table_rows(page)["whole run"])["ended/s"] or 0) == 0 or not run["MFU %"]:
                assert time.monotonic() < deadline, run
                page.wait_for_timeout(500)
            windows = [name for name in table_rows(page) if name != "whole run"]
            assert windows and all(re.fullmatch(r"\d\d:\d\d:\d\d", name) for name in windows)
            values = {title: float(text) for title, text in run.items() if title != "window from"}
            assert values["ended/s"] > 0 and values["output tokens/s"] > 0 and 0 <= values["in flight"] <= 2
            assert 0 < values["TTFT p50 (ms)"] <= values["TTFT p99 (ms)"]
            assert 0 < values["TBT p50 (ms)"] <= values["TBT p99 (ms)"]
            assert values["SLO met % (TBT ≤ 1000 ms)"] > 0  # conf/slo/relaxed.yaml: 25 x 40 ms
            assert 0 < values["MFU %"] < 100 and 0 < values["MBU %"] < 100  # the server's, from its /metrics
            browser.close()
        csv_lines = httpx.get(f"{web}/llm_stats/csv", trust_env=False).text.splitlines()
        assert csv_lines[0].startswith("name,in_flight,ended,") and csv_lines[-1].startswith("whole run,")
    finally:
        ui.terminate()
        ui.wait(timeout=30)

