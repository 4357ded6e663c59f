"""The worker processes of this node, as the driver sees them: spawned with torch.multiprocessing, each tied
to the driver by a pipe. Closing the pipe stops a worker (it exits when its end reads EOF, also when the
driver itself dies, so no worker outlives it); a worker that fails sends its error through the pipe first."""
from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch.multiprocessing as mp

from stallfree.engine.runner.base import RunnerDead

STOP_GRACE_S = 5.0  # for a worker to leave after its pipe closed, before it is terminated


class WorkerDied(RunnerDead):
    """A worker process ended while the engine ran."""


@dataclass
class WorkerProcess:
    rank: int
    process: mp.Process  # a spawn context's process
    pipe: Connection  # the driver's end
    last_words: str = ""  # the error a failing worker sent before it exited

    def describe_death(self) -> str:
        code = self.process.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        try:
            if not self.last_words and self.pipe.poll():
                self.last_words = self.pipe.recv()
        except (EOFError, OSError):
            pass
        words = f": {self.last_words}" if self.last_words else ""
        return f"worker rank {self.rank} (pid {self.process.pid}) {how}{words}"


class LocalWorkers:
    def __init__(self, workers: list[WorkerProcess]):
        self.workers = workers

    @classmethod
    def spawn(cls, ranks: range | list[int], target: Callable[..., None], args: tuple) -> LocalWorkers:
        """Start ``target(rank, *args, pipe)`` in a fresh process for each rank."""
        context = mp.get_context("spawn")
        workers = []
        try:
            for rank in ranks:
                driver_end, worker_end = context.Pipe()
                process = context.Process(target=target, args=(rank, *args, worker_end), daemon=True,
                                          name=f"stallfree-rank-{rank}")
                process.start()
                worker_end.close()  # only the worker holds it now: its EOF is the driver's end closing
                workers.append(WorkerProcess(rank, process, driver_end))
        except BaseException:
            cls(workers).stop()
            raise
        return cls(workers)

    def first_death(self) -> str | None:
        """The first worker that has ended, described; None while all run."""
        dead = next((w for w in self.workers if not w.process.is_alive()), None)
        return None if dead is None else dead.describe_death()

    def check(self) -> None:
        """Raise WorkerDied if a worker has ended."""
        if (death := self.first_death()) is not None:
            raise WorkerDied(death)

    def wait_for_death(self, timeout_s: float) -> str | None:
        """The first worker to end within ``timeout_s``, described (a collective that failed on the driver
        may have seen its peer go before the process was reaped); None if all still run."""
        ended = wait([w.process.sentinel for w in self.workers], timeout_s) if self.workers else []
        for worker in self.workers:
            if worker.process.sentinel in ended:
                worker.process.join(timeout_s)  # its files close before its exit status is there to read
        return self.first_death()

    def stop(self) -> None:
        """Stop every worker: close the pipes, then terminate and at last kill the ones still there."""
        for worker in self.workers:
            worker.pipe.close()
        for ending in ("pipe closed", "terminate", "kill"):
            alive = [w.process for w in self.workers if w.process.is_alive()]
            if not alive:
                break
            for process in alive:
                if ending != "pipe closed":
                    getattr(process, ending)()
            wait([p.sentinel for p in alive], STOP_GRACE_S)
        for worker in self.workers:
            worker.process.join(0)  # reap
