"""What every instance process of a deployment split across processes shares (the prefill instance of
``parallel.disaggregation``, the replicas of ``parallel.data_parallel_size``): its process frame, the handshake
that says it is ready, and sends to it that a dead process does not break."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from stallfree.engine.distributed.workers import LocalWorkers, WorkerDied


def run_instance(pipe: Connection, name: str, body: Callable[[], None]) -> None:
    """Run ``body`` as the process's life: Ctrl-C is the front end's to handle, the pipe closing (or the front end
    dying) stops it, and a failure is sent on the pipe as ``("died", error)`` before the process exits 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        body()
    except (EOFError, OSError):
        os._exit(0)
    except BaseException as exc:
        try:
            pipe.send(("died", f"{name} failed: {type(exc).__name__}: {exc}"))
        finally:
            os._exit(1)
    os._exit(0)


def expect_ready(workers: LocalWorkers, pipe: Connection, timeout_s: float, name: str) -> tuple:
    """The ``("ready", ...)`` message of one instance; WorkerDied if it dies or says it failed first, or does not
    start within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not pipe.poll(0.05):
        workers.check()
        if time.monotonic() > deadline:
            raise WorkerDied(f"{name} did not start within {timeout_s:g} s (parallel.startup_timeout_s)")
    message = pipe.recv()
    if message[0] != "ready":
        raise WorkerDied(message[1])
    return message


def send_quietly(pipe: Connection, message: tuple) -> None:
    """Send unless the instance is gone: the next step finds out why and ends its requests."""
    try:
        pipe.send(message)
    except OSError:
        pass
