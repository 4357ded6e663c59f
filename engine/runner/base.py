"""The ``Runner`` protocol: what the engine asks of the thing that executes one iteration."""
from __future__ import annotations

from typing import Protocol

from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput


class Runner(Protocol):
    # Whether the runner reads the units' block tables (else the scheduler need not copy them into its snapshots).
    reads_block_tables: bool
    # Whether the runner computes logits, so that requests may ask for logprobs.
    computes_logits: bool

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one iteration: the sampled tokens of the units that sample, and what the iteration measured."""
        ...


class RunnerDead(RuntimeError):
    """The runner can run no iteration any more (a worker process of a distributed runner died): the engine
    ends every request in flight with this error and stops."""
