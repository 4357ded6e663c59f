"""A ``stallfree-serve`` process as a context manager: started and answering on enter, stopped on exit.

It serves the run's model / scheduler groups (engine.hydra_groups.serve_overrides), logs to
``<log_dir>/server-<port>.log`` and, on Linux, dies with the bench process even when that is killed.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from stallfree.engine.hydra_groups import ConfigError, serve_overrides
from stallfree.loadgen.sweep.bench_schema import BenchConfig

STOP_TIMEOUT_S = 15


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM when the bench process dies, even by SIGKILL."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServeProcess:
    """``with ServeProcess(cfg, log_dir) as server:`` a stallfree-serve at ``server.url`` for the run's
    server-side config (model, scheduler, chunk_size) on ``target.host`` / ``target.port`` (0: free)."""

    def __init__(self, cfg: BenchConfig, log_dir: Path):
        t = cfg.target
        port = t.port or _free_port(t.host)
        self.url = f"http://{t.host}:{port}"
        self.startup_timeout_s = t.startup_timeout_s
        self.log_path = log_dir / f"server-{port}.log"
        server = {"chunk_size": cfg.chunk_size, "host": t.host, "port": port, "served_model_name": cfg.model.name}
        exe = Path(sys.executable).with_name("stallfree-serve")
        self.command = [str(exe) if exe.exists() else "stallfree-serve",
                        *serve_overrides(cfg.composed["model"], cfg.composed["scheduler"], server)]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServeProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise ConfigError(f"target: stallfree-serve exited with status {self.process.returncode}: "
                                  f"{tail[0]} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"stallfree-serve did not answer on {self.url} within {self.startup_timeout_s} s "
                           f"(log: {self.log_path})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
