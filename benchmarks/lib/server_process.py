"""A benchmark's server process: started in a session of its own, ready once /health answers, stopped with
its whole process group; and the busiest process of its tree (the engine)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from stallfree.loadgen.sweep.cpu_share import sample


def descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in descendants(c)]


def busiest_process(pid: int) -> int:
    """The process of the tree under ``pid`` that has used the most CPU (the engine: vLLM's worker)."""
    return max([pid, *descendants(pid)], key=lambda p: sample(p).engine_cpu_s)


def start_server(command: list[str], url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{command[0]} did not become ready; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
