"""Multi-turn sessions through Locust (loadgen/locust/process_run.py): each follow-up turn sent its think time
after the turn before it ended, in the open loop and the closed one, a failed turn ending its session, and
target=locust running the bench's session workloads. Locust runs as subprocesses against the fake SSE server
(tests/helpers/fakes/fake_sse_server.py) or a tiny stallfree-serve."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from stallfree.engine.records.request_record import NOT_SENT
from stallfree.engine.server import start_server
from stallfree.loadgen.locust.target import read_records
from stallfree.loadgen.results.run_dir import requests_frame
from tests.helpers.fakes.fake_sse_server import running_fake_server
from tests.helpers.locust import locust_command, locust_stats

pytestmark = pytest.mark.slow


def run_headless(host: str, out: Path, *args: str) -> pd.DataFrame:
    command = locust_command(host, "--headless", "--only-summary", "--exit-code-on-error", "0", "--csv",
                             str(out / "locust"), "--rows-dir", str(out / "rows"), "--model", "fake", *args)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return requests_frame(read_records(out / "rows"))


def assert_turns_follow(df: pd.DataFrame) -> None:
    """Every follow-up turn was due after the turn before it ended, and sent no earlier."""
    assert df["session_id"].notna().all()
    for _, turns in df.sort_values("turn").groupby("session_id"):
        assert list(turns["turn"]) == list(range(len(turns)))
        before, after = turns.iloc[:-1], turns.iloc[1:]
        sent = after["send_time"].notna()
        assert (after["intended_send_time"].to_numpy() >= before["finish_time"].to_numpy()).all()
        assert (after["send_time"][sent] >= after["intended_send_time"][sent] - 1e-3).all()


@pytest.fixture(scope="module")
def fake_url():
    with running_fake_server(ttft_ms=20, tbt_ms=2) as url:
        yield url


def test_open_loop_sessions_send_each_turn_after_the_one_before(fake_url, tmp_path):
    df = run_headless(fake_url, tmp_path, "OpenLoopUser", "--workload", "chat", "--qps", "4", "--num-requests", "30")
    assert len(df) == 30 and (df["status"] == "ok").all()
    assert_turns_follow(df)
    assert df["session_id"].nunique() < 30  # several turns a session
    table = locust_stats(tmp_path)
    follow_ups = int((df["turn"] > 0).sum())
    assert table.loc["completions", "Request Count"] == 30 - follow_ups
    assert table.loc["completions follow-up", "Request Count"] == follow_ups > 0


def test_closed_loop_users_run_one_session_at_a_time(fake_url, tmp_path):
    df = run_headless(fake_url, tmp_path, "LLMUser", "--users", "2", "--spawn-rate", "2", "--workload", "agentic",
                      "--num-requests", "20")
    assert len(df) == 20 and (df["status"] == "ok").all()
    assert_turns_follow(df)
    events = sorted([(t, 1) for t in df["send_time"]] + [(t, -1) for t in df["finish_time"]], key=lambda e: e[0])
    in_flight = pd.Series([change for _, change in events]).cumsum()
    assert in_flight.max() <= 2


def test_a_failed_turn_ends_its_session_and_the_others_go_on(tmp_path):
    with running_fake_server(ttft_ms=20, tbt_ms=2, die_after=6) as url:
        df = run_headless(url, tmp_path, "OpenLoopUser", "--workload", "chat", "--qps", "4", "--num-requests", "24")
    assert len(df) == 24 and (df["status"] == "ok").sum() == 6  # every request has its row
    for _, turns in df.sort_values("turn").groupby("session_id"):
        failed = turns[turns["status"] != "ok"]
        if failed.empty:
            continue
        first = failed.iloc[0]
        assert pd.notna(first["send_time"])  # the failed turn was sent
        rest = failed.iloc[1:]
        assert rest["send_time"].isna().all()
        assert rest["error"].str.startswith(f"{NOT_SENT}: turn {int(first['turn'])} of its session ended").all()


def test_bench_target_locust_runs_session_workloads(tmp_path):
    with start_server({"model": "tiny", "dtype": "float32", "enable_prefix_caching": True}) as server:
        command = [str(Path(sys.executable).with_name("stallfree-bench")), "target=locust",
                   f"target.url={server.url}", "target.token_ids=true", "workload=chat", "workload.lengths.think_time_s=0.1",
                   "num_requests=12", "qps=2", "slo.tbt_ms=1000", f"results_dir={tmp_path}", "experiment_name=chat"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "chat").iterdir() if p.is_dir() and not p.name.startswith(".")]
    df = pd.read_parquet(run_dir / "requests.parquet")
    assert len(df) == 12 and (df["status"] == "ok").all()
    assert_turns_follow(df)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_sessions"] == df["session_id"].nunique() and summary["median_ttft_follow_up_ms"] is not None
    # the server's cache was emptied before the run and served each session's history from then on
    assert summary["prefix_cache_reset"] == "reset" and 0.3 < summary["workload_ideal_hit_rate"] < 1
    assert summary["server_prefix_cache_hit_rate"] == pytest.approx(summary["workload_ideal_hit_rate"], abs=0.02)
