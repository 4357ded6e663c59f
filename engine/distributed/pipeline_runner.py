"""PipelineRunner: the driver's side of pipeline parallelism, a ``BatchRunner`` (engine/runner/base.py) the
engine steps as it steps every runner.

The driver is rank 0 and runs stage 0 in the engine's process. ``submit`` posts the micro-batch's ticket to
every worker, runs stage 0 and sends its hidden states on, then returns: the engine schedules the next
micro-batch (among the requests not in flight) while the later stages work, up to PP micro-batches in flight,
as vLLM's virtual engines and sarathi-serve's pipeline do. The last stage samples and posts the result, with
every stage's busy, idle and hand-off seconds, to the driver's mailbox. Any failure ends the pipeline: every
worker is stopped and RunnerDead (naming the dead worker, or the driver's error) ends the engine's requests.
"""
from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.distributed.mailbox import Mailbox
from stallfree.engine.distributed.stage_link import StageLink, StageTimer, Ticket
from stallfree.engine.distributed.teardown import DEATH_GRACE_S, is_collective_failure, stop_ranks
from stallfree.engine.distributed.workers import LocalWorkers, WorkerDied
from stallfree.engine.runner.base import FinishedBatch, RunnerDead
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.utilization import MachineLimits

T = TypeVar("T")


@dataclass
class Submitted:
    sound: bool = True  # every posted micro-batch went through stage 0: a stop message in line reaches every rank


def _stop_pipeline(workers: LocalWorkers, mailbox: Mailbox, ranks: range, sequence: Submitted) -> None:
    """Post a stop in every worker's line where the pipeline is sound (other nodes' workers learn it only so;
    this node's also leave when their pipes close), then stop this node's workers and leave the group."""
    if sequence.sound and workers.first_death() is None:
        for rank in ranks:
            mailbox.post(rank, None)
    stop_ranks(workers)


class PipelineRunner:
    reads_block_tables = True
    computes_logits = True
    machine_limits: MachineLimits | None = None  # this machine's, measured

    def __init__(self, local: ModelRunner, layout: RankLayout, mailbox: Mailbox, link: StageLink,
                 workers: LocalWorkers, num_blocks: int):
        self.local, self.mailbox, self.link, self.workers = local, mailbox, link, workers
        self.num_blocks = num_blocks  # the fewest any rank holds
        self.max_in_flight = layout.pipeline_parallel_size
        self.worker_ranks = range(1, layout.world_size)
        self.in_flight: deque[tuple[SchedulerOutput, float]] = deque()  # with when each was scheduled
        self.sequence = Submitted()
        self.timer, self.period_start_s = StageTimer(), 0.0
        self._finalizer = weakref.finalize(self, _stop_pipeline, workers, mailbox, self.worker_ranks, self.sequence)

    @property
    def full(self) -> bool:
        return len(self.in_flight) >= self.max_in_flight

    def submit(self, scheduler_output: SchedulerOutput, now: float) -> None:
        """Stage 0's part (its busy time counts from ``now``, so it includes scheduling, as the simulator's
        CPU overhead does), the rest handed on."""
        self._guard(lambda: self._submit(scheduler_output, now))

    def _submit(self, scheduler_output: SchedulerOutput, now: float) -> None:
        self.workers.check()
        ticket = Ticket(scheduler_output, self.period_start_s)
        self.sequence.sound = False  # until stage 0 has handed it on
        for rank in self.worker_ranks:
            self.mailbox.post(rank, ticket)
        hidden = self.local.execute_forward(scheduler_output)
        end = time.time()
        self.link.send(hidden, [*self.timer.time(now, end, self.period_start_s), end])
        self.in_flight.append((scheduler_output, now))
        self.sequence.sound = True

    def pop_finished(self, now: float) -> list[FinishedBatch]:
        finished = []
        while self.in_flight and self._guard(self.mailbox.has):
            result: ModelRunnerOutput = self.mailbox.take()
            scheduler_output, start = self.in_flight.popleft()
            finished.append(FinishedBatch(scheduler_output, result, start, time.time()))
        return finished

    def wait(self) -> bool:
        if not self.in_flight:
            return False
        self._guard(lambda: self.mailbox.wait(self.workers.check))
        return True

    def idle_until(self, t: float) -> None:
        self.period_start_s = max(self.period_start_s, t)

    def shutdown(self) -> None:
        """Stop every worker and leave the process group (again: a no-op)."""
        self._finalizer()

    def _guard(self, action: Callable[[], T]) -> T:
        """``action``, or on any failure the pipeline stopped and RunnerDead naming the cause raised."""
        try:
            return action()
        except RunnerDead:
            self.shutdown()
            raise
        except Exception as exc:
            death = self.workers.wait_for_death(DEATH_GRACE_S) if is_collective_failure(exc) else None
            self.shutdown()
            if death is not None:
                raise WorkerDied(death) from exc
            raise RunnerDead(f"pipeline stage 0 failed: {type(exc).__name__}: {exc}") from exc
