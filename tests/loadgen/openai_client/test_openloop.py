import asyncio
import os
import signal
import socket
import threading

import numpy as np
import pytest

from stallfree.engine.records.request_metrics import summarize
from stallfree.loadgen.openai_client.client import iter_body, read_head
from stallfree.loadgen.openai_client.openloop import run_open_loop, run_open_loop_sync
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.workload.request_specs import RequestSpec, build_workload
from tests.helpers.fakes.fake_sse_server import realtime_priority, running_fake_server
from tests.helpers.machine_stalls import retry_while_stalled

TTFT_MS, TBT_MS = 20.0, 5.0


@pytest.fixture(scope="module")
def fake_url():
    with running_fake_server(ttft_ms=TTFT_MS, tbt_ms=TBT_MS) as url:
        yield url


def specs_at(offsets, max_tokens=4) -> list[RequestSpec]:
    return [RequestSpec(f"r{i}", t, [11, 12, 13], max_tokens) for i, t in enumerate(offsets)]


@pytest.mark.slow
def test_open_loop_at_200_qps(fake_url):
    """Behaviour at 200 QPS: every request completes, on an open-loop schedule, with the server's timings
    joined. How closely the sends follow the schedule (p99 lag < 5 ms on a quiet machine) is a timing
    figure: benchmarks/client_fidelity.py measures it; the bounds here only tell an open loop from a
    client that falls seconds behind, so that a loaded 2-core machine cannot fail them."""
    specs = build_workload({"kind": "poisson", "qps": 200}, {"kind": "fixed", "prompt": 16, "output": 8},
                           num_requests=2000, seed=0, vocab_size=1000)

    def attempt():
        with realtime_priority():
            df = requests_frame(asyncio.run(run_open_loop(fake_url, specs, model="fake", timeout_s=10)))
        return df, summarize(df)

    (df, s), stalls = retry_while_stalled(attempt, lambda result: result[1]["schedule_lag_p99_ms"] < 100)
    context = f"load average {os.getloadavg()}, machine stalls (s) per attempt {stalls}, summary {s}"
    assert s["completed"] == 2000, context
    assert s["achieved_rate"] / s["offered_rate"] > 0.8, context
    assert 0 <= s["schedule_lag_p50_ms"] <= s["schedule_lag_p99_ms"] < 100, context
    # the fake server cannot answer sooner than its delays; a client that fell behind would see seconds
    assert TTFT_MS <= s["median_ttft_ms"] < 10 * TTFT_MS, context
    assert TBT_MS * 0.5 <= s["median_tbt_ms"] < 10 * TBT_MS, context
    # server-side timings from the final chunk are joined row by row
    assert (df["output_tokens"] == 8).all() and (df["num_preemptions"] == 0).all()
    assert (df["server_token_times"].map(len) == 8).all()
    assert (df["server_arrival_time"] >= df["send_time"]).all()


@pytest.mark.parametrize("status", [400, 500])
def test_http_errors_become_error_rows(fake_url, status):
    rows = run_open_loop_sync(fake_url, specs_at([0.0] * 3), model=f"fake-status-{status}", timeout_s=5)
    assert [r.status for r in rows] == ["error"] * 3
    assert all(r.error.startswith(f"HTTP {status}: ") and "fake error" in r.error for r in rows)
    assert all(r.finish_time >= r.send_time for r in rows)


def test_dead_port_gives_one_error_row_per_request():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows = run_open_loop_sync(f"http://127.0.0.1:{port}", specs_at([0.0, 0.01, 0.02]), model="m", timeout_s=5)
    assert [(r.request_id, r.status) for r in rows] == [("r0", "error"), ("r1", "error"), ("r2", "error")]
    assert all("ConnectionRefusedError" in r.error for r in rows)


def test_timeout_rows_keep_the_tokens_received(fake_url):
    rows = run_open_loop_sync(fake_url, specs_at([0.0], max_tokens=400), model="fake", timeout_s=0.1)
    assert rows[0].status == "timeout"
    assert 10 <= rows[0].output_tokens == len(rows[0].token_times) < 400


def test_cancel_returns_a_row_for_every_spec(fake_url):
    specs = specs_at([0.0, 0.0, 0.0, 30.0], max_tokens=400)

    async def cancel_soon():
        task = asyncio.create_task(run_open_loop(fake_url, specs, model="fake", timeout_s=10, max_in_flight=2))
        await asyncio.sleep(0.2)
        task.cancel()
        return await task

    rows = asyncio.run(cancel_soon())
    assert [(r.status, r.error) for r in rows] == [("aborted", "cancelled while in flight")] * 2 + [
        ("aborted", "not sent")] * 2  # r2 waited for a free slot, r3 was not due yet
    assert all(r.output_tokens > 0 for r in rows[:2]) and rows[2].send_time is None


@pytest.mark.parametrize("nice", [0, 3])
def test_ctrl_c_stops_the_sync_run_cleanly(fake_url, nice):
    # Ctrl-C as at a terminal: Python's own SIGINT handler, whatever earlier code in this process set.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        rows = run_open_loop_sync(fake_url, specs_at([0.0, 30.0], max_tokens=400), model="fake", timeout_s=10,
                                  nice=nice)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [(r.status, r.error) for r in rows] == [("aborted", "cancelled while in flight"),
                                                         ("aborted", "not sent")]


def test_a_nicer_client_replays_in_a_thread_of_its_own(fake_url):
    """``nice`` (target.client_nice): the loop's thread runs that much nicer; the caller keeps its value."""
    nice, seen = os.getpriority(os.PRIO_PROCESS, 0), []

    def progress(record):
        seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)))

    rows = run_open_loop_sync(fake_url, specs_at([0.0] * 2), model="fake", timeout_s=5, nice=4, progress=progress)
    assert [r.status for r in rows] == ["ok"] * 2
    assert [value for _, value in seen] == [min(19, nice + 4)] * 2
    assert threading.get_native_id() not in {tid for tid, _ in seen}
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice


def test_in_flight_cap_delays_sends_and_records_the_lag(fake_url):
    rows = run_open_loop_sync(fake_url, specs_at([0.0] * 3), model="fake", timeout_s=5, max_in_flight=1)
    assert [r.status for r in rows] == ["ok"] * 3
    for before, after in zip(rows, rows[1:], strict=False):
        assert after.send_time >= before.finish_time
    lags = [r.send_time - r.intended_send_time for r in rows]
    assert lags[2] > lags[1] > lags[0] >= 0  # each waited for the one before it (~35 ms each)


def test_schedule_is_absolute_and_warmup_duration_progress(fake_url):
    seen = []
    specs = specs_at([0.0, 0.1, 0.2, 0.3, 5.0], max_tokens=2)
    rows = run_open_loop_sync(fake_url, specs, model="fake", timeout_s=5, warmup=2, duration_s=1.0,
                              progress=seen.append)
    assert [r.request_id for r in rows] == ["r0", "r1", "r2", "r3"]  # r4 lies beyond duration_s
    assert [r.is_warmup for r in rows] == [True, True, False, False]
    assert sorted(r.request_id for r in seen) == ["r0", "r1", "r2", "r3"]
    intended = np.array([r.intended_send_time for r in rows])
    np.testing.assert_allclose(np.diff(intended), 0.1, atol=1e-6)  # epoch float precision
    lags = np.array([r.send_time for r in rows]) - intended
    assert (lags >= 0).all() and (lags < 0.5).all()  # sent on schedule, not after the responses (~0.1 s each)


async def _body_of(raw: bytes) -> tuple[int, bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(raw)
    reader.feed_eof()
    status, headers = await read_head(reader)
    return status, b"".join([piece async for piece in iter_body(reader, headers)])


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx: y\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
    b"HTTP/1.0 200 OK\r\nconnection: close\r\n\r\nhello world",
])
def test_response_body_framings(raw):
    assert asyncio.run(_body_of(raw)) == (200, b"hello world")
