"""Ten mistakes a user makes at run time, scripted: each ends with one line that says what went wrong and
what to do, a documented exit code (loadgen.config.errors), and no traceback."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallfree.engine.server import start_server
from stallfree.loadgen.config.errors import EXIT_INTERRUPTED, exit_on_error
from tests.helpers.paths import LOCUSTFILE

BIN = Path(sys.executable).parent
ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "STALLFREE_DEBUG")}
RUN = ["num_requests=2", "workload=fixed", "workload.lengths.prompt=8", "workload.lengths.output=4",
       "slo.tbt_ms=1000"]


@pytest.fixture(scope="module")
def tiny_url():
    with start_server({"model": "tiny", "dtype": "float32"}) as server:
        yield server.url


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(command: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV)


def interrupt_after(command: list[str], cwd: Path, seconds: float,
                    started: Path | None = None) -> subprocess.CompletedProcess:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) ``seconds`` after the start (after
    ``started`` exists, when given)."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, start_new_session=True)
    deadline = time.monotonic() + 120
    while started is not None and not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def assert_one_line(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    text = done.stdout + done.stderr
    assert "Traceback" not in text, text[-3000:]
    assert done.returncode == code, (done.returncode, text[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, text[-2000:]
    assert all(word in lines[-1] for word in words), lines[-1]


def test_bench_against_a_server_that_is_down(tmp_path):
    done = run([BIN / "stallfree-bench", "target=url", f"target.url=http://127.0.0.1:{closed_port()}", *RUN,
                f"results_dir={tmp_path}"], tmp_path)
    assert_one_line(done, 3, "stallfree-bench: target error", "cannot reach", "start the server")


def test_capacity_against_a_url_without_a_scheme(tmp_path):
    done = run([BIN / "stallfree-capacity", "target=url", "target.url=127.0.0.1:8000", *RUN,
                f"results_dir={tmp_path}"], tmp_path)
    assert_one_line(done, 3, "target.url", "fix target.url")


def test_bench_with_a_model_the_server_does_not_serve(tiny_url, tmp_path):
    done = run([BIN / "stallfree-bench", "target=url", f"target.url={tiny_url}", "target.served_model=llama",
                *RUN, f"results_dir={tmp_path}"], tmp_path)
    assert_one_line(done, 3, "does not serve 'llama'", "target.served_model=tiny")


def test_bench_into_a_directory_it_cannot_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = run([BIN / "stallfree-bench", "model.runner=simulated", "model.clock=virtual", *RUN,
                f"results_dir={blocker}"], tmp_path)
    assert_one_line(done, 2, "stallfree-bench: config error", "results_dir")


@pytest.mark.slow
def test_bench_interrupted(tmp_path):
    done = interrupt_after([BIN / "stallfree-bench", "num_requests=400", "qps=2", f"results_dir={tmp_path}"],
                           tmp_path, seconds=3, started=tmp_path / "default" / ".hydra")  # the job has started
    assert_one_line(done, 130, "interrupted", "run the same command again")


def test_ctrl_c_during_a_finalizer_still_stops_the_command():
    """Python ignores an exception raised in ``__del__``: a Ctrl-C that lands there (the garbage collector
    freeing a tokenizer's regexes) must still end the command, not let it run on."""

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # Ctrl-C arrives while a finalizer runs

    def job() -> None:
        Finalized()  # finalized at once
        time.sleep(10)  # the rest of the job

    # a command starts with Python's own Ctrl-C handler, whatever an earlier test in this process left behind
    leftover = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(SystemExit) as ended:
            exit_on_error("prog", job)
        assert ended.value.code == EXIT_INTERRUPTED and time.monotonic() - start < 5
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, leftover)


def test_serve_a_checkpoint_that_is_not_there(tmp_path):
    done = run([BIN / "stallfree-serve", str(tmp_path / "no-such-ckpt")], tmp_path)
    assert_one_line(done, 2, "stallfree-serve: error", "model.model")


@pytest.mark.slow
def test_serve_interrupted(tmp_path):
    """Ctrl-C 6 s after the start: while loading (a slow machine) exit 130 "interrupted while loading",
    once serving (a quiet one) exit 0 "stopped"; one line either way."""
    done = interrupt_after([BIN / "stallfree-serve", "small", "port=0"], tmp_path, seconds=6)
    if "stallfree-serve ready" in done.stdout:
        assert "Traceback" not in done.stdout + done.stderr and done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "stallfree-serve: stopped", done.stdout
    else:
        assert_one_line(done, 130, "interrupted")


def test_report_on_a_directory_without_runs(tmp_path):
    (tmp_path / "experiment").mkdir()
    assert_one_line(run([BIN / "stallfree-report", str(tmp_path)], tmp_path), 2, "no runs under")
    assert_one_line(run([BIN / "stallfree-report", str(tmp_path / "typo")], tmp_path), 2, "not found")


@pytest.mark.slow
def test_locust_against_a_server_that_is_down(tmp_path):
    locustfile = LOCUSTFILE
    done = run([BIN / "locust", "-f", str(locustfile), "--host", f"http://127.0.0.1:{closed_port()}", "--headless",
                "--only-summary", "-t", "3s", "OpenLoopUser", "--qps", "2", "--prompt-len", "8", "--max-tokens", "4"],
               tmp_path)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and done.returncode == 1, text[-3000:]  # failures: Locust's exit code 1
    assert "Connection refused" in text or "ConnectionRefused" in text
