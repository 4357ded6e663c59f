"""SerialRunner: a ``Runner`` that executes one iteration at a time, stepped as a pipeline of depth 1.

``submit`` runs the iteration at once, so its result is back before the engine asks for it and nothing is
ever in flight when the next one is scheduled. A step that raises is re-run on parts of its units to end
only the requests it fails on (``engine/runner/isolation.py``).
"""
from __future__ import annotations

import logging

from stallfree.engine.runner.base import FinishedBatch, Runner, RunnerDead
from stallfree.engine.runner.clock import Clock
from stallfree.engine.runner.isolation import execute_isolating
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.utilization import MachineLimits

logger = logging.getLogger("stallfree.engine")


class SerialRunner:
    max_in_flight = 1
    full = False  # the one micro-batch is finished when ``submit`` returns
    machine_limits: MachineLimits | None = None

    def __init__(self, runner: Runner, clock: Clock):
        self.runner, self.clock = runner, clock
        self.reads_block_tables, self.computes_logits = runner.reads_block_tables, runner.computes_logits
        self.finished: list[FinishedBatch] = []

    def submit(self, scheduler_output: SchedulerOutput, now: float) -> None:
        try:
            result, errors = self.runner.execute_model(scheduler_output), {}
        except RunnerDead:  # no request's fault: the engine ends them all
            raise
        except Exception as exc:  # end only the requests it failed on; the others keep their tokens
            logger.warning("engine.step raised; re-running it to find the requests it fails on", exc_info=exc)
            result, errors = execute_isolating(self.runner, scheduler_output, exc)
        self.finished.append(FinishedBatch(scheduler_output, result, now, self.clock(), errors))

    def pop_finished(self, now: float) -> list[FinishedBatch]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self) -> bool:
        return False

    def idle_until(self, t: float) -> None:
        pass

    def shutdown(self) -> None:
        self.runner.shutdown()
