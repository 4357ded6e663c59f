"""Faults of a TP2 engine: a worker killed mid-run, shutdown, Ctrl-C, a killed driver and a rank that never
joins. None leaves a process behind."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from stallfree.engine import SamplingParams
from stallfree.engine.distributed import distributed_runner, workers
from stallfree.engine.distributed.rendezvous import StartupTimeout
from stallfree.engine.runner.base import RunnerDead
from tests.engine.distributed.conftest import tp2_engine

LONG = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
# A driver in its own process: it prints its workers' pids, then generates until it is stopped.
DRIVER_SCRIPT = """
import psutil
from stallfree.engine import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM("tiny", dtype="float32", device="cpu", {parallel}=2)
    print(*[w.process.pid for w in llm.engine.runner.workers.workers], flush=True)
    while True:
        llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True))
"""


def never_joins(rank, rendezvous, layout, pipe) -> None:
    """A worker rank that hangs before it joins the group (a stand-in for a stuck or misconfigured rank)."""
    time.sleep(600)


def fails_to_start(rank, rendezvous, layout, pipe) -> None:
    """The real worker entry, whose rank fails as it starts (in the worker's process)."""
    from stallfree.engine.distributed import worker

    def no_space(*_):
        raise OSError("no space left on device")

    worker.serve = no_space
    worker.run_worker(rank, rendezvous, layout, pipe)


def wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def test_worker_killed_mid_run_ends_every_request_with_the_cause(no_orphans):
    engine = tp2_engine()
    worker = engine.runner.workers.workers[0].process
    ids = [engine.add_request([1 + i, 2, 3], LONG) for i in range(8)]
    threading.Timer(0.5, os.kill, (worker.pid, signal.SIGKILL)).start()  # while steps run
    finished = {}
    deadline = time.monotonic() + 60
    while len(finished) < len(ids) and time.monotonic() < deadline:
        finished |= {out.request_id: out for out in engine.step() if out.finished}
    assert set(finished) == set(ids)
    for out in finished.values():
        assert out.finish_reason == "error"
        assert out.error == f"the engine stopped: worker rank 1 (pid {worker.pid}) killed by SIGKILL"
    with pytest.raises(RunnerDead, match="worker rank 1"):
        engine.add_request([1, 2, 3], LONG)
    with pytest.raises(RunnerDead, match="worker rank 1"):
        engine.step()


def test_shutdown_stops_every_worker(no_orphans):
    engine = tp2_engine()
    pids = [w.process.pid for w in engine.runner.workers.workers]
    engine.shutdown()
    assert wait_gone(pids, 5) == []
    engine.shutdown()  # again: nothing to do


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill"])
@pytest.mark.parametrize("parallel", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_stopped_driver_leaves_no_worker(stop, parallel):
    """Ctrl-C reaches the terminal's whole process group; SIGKILL only the driver: no worker outlives it."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER_SCRIPT.format(parallel=parallel)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip(), proc.stderr.read()
        pids = [int(p) for p in line.split()]
        time.sleep(1.0)  # mid-generation
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.kill()
        proc.wait(timeout=30)
        assert wait_gone(pids) == [], f"workers left after {stop}"
    finally:
        proc.kill()
        proc.wait()


def test_rank_that_never_joins_times_out_naming_it(monkeypatch, no_orphans):
    monkeypatch.setattr(distributed_runner, "run_worker", never_joins)
    monkeypatch.setattr(workers, "STOP_GRACE_S", 0.5)
    started = time.monotonic()
    with pytest.raises(StartupTimeout, match=r"^rank 1 of 2 did not join the process group within 2 s"):
        tp2_engine(startup_timeout_s=2.0)
    assert time.monotonic() - started < 30


def test_rank_that_fails_to_start_is_named_with_its_error(monkeypatch, no_orphans):
    monkeypatch.setattr(distributed_runner, "run_worker", fails_to_start)
    with pytest.raises(workers.WorkerDied, match=r"^startup failed: worker rank 1 \(pid \d+\) exited with code 1: "
                                                 r"OSError: no space left on device$"):
        tp2_engine()
