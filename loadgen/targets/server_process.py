"""A server command as a child process, the one way this project starts a server it then measures: the bench's
``stallfree-serve`` (serve_process.py) and the benchmarks' servers, ours and vLLM's.

The server runs in a session of its own and is stopped with its whole process group (vLLM starts worker
processes); on Linux it also gets SIGTERM when the process that started it dies, even by SIGKILL. It is ready
once ``GET {url}/health`` answers 200.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STOP_TIMEOUT_S = 30


class ServerExited(RuntimeError):
    """The server process ended before it answered /health."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """``with ServerProcess(command, url, log_path) as server:`` the command running, answering on ``url``."""

    def __init__(self, command: list[str], url: str, log_path: Path, *, startup_timeout_s: float = 900,
                 env: dict[str, str] | None = None):
        self.command, self.url, self.log_path = command, url.rstrip("/"), log_path
        self.startup_timeout_s, self.env = startup_timeout_s, env
        self.process: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return Path(self.command[0]).name

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise ServerExited(f"{self.name} exited with status {self.process.returncode}: {tail[0]} "
                                   f"(log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not answer on {self.url} within {self.startup_timeout_s} s "
                           f"(log: {self.log_path})")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
