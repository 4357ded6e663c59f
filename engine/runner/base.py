"""The runner protocols: what the engine asks of the thing that executes its iterations.

``Runner`` executes one iteration at a time. ``BatchRunner`` is what the engine steps: micro-batches in,
finished micro-batches out, up to ``max_in_flight`` of them in flight at once (a pipeline of that many
stages). A ``Runner`` is a ``BatchRunner`` of depth 1 (``engine/runner/serial.py``); a simulated deployment's
pipeline and the real pipeline of stage workers implement ``BatchRunner`` themselves. The engine schedules
all of them with one step: the scheduler keeps the requests of micro-batches in flight out of the next ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.utilization import MachineLimits


class Runner(Protocol):
    # Whether the runner reads the units' block tables (else the scheduler need not copy them into its snapshots).
    reads_block_tables: bool
    # Whether the runner computes logits, so that requests may ask for logprobs.
    computes_logits: bool

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one iteration: the sampled tokens of the units that sample, and what the iteration measured."""
        ...

    def shutdown(self) -> None:
        """Stop the processes it runs on besides this one, if any (again: a no-op)."""
        ...


@dataclass
class FinishedBatch:
    """A micro-batch whose result is back: what the engine applies to its requests and records."""

    output: SchedulerOutput
    result: ModelRunnerOutput
    start_s: float  # on the engine's clock, when it was scheduled
    end_s: float  # when it left the last stage (its tokens sampled)
    # The requests it failed on, with the exception (they end with status "error"); the others keep their tokens.
    errors: dict[str, Exception] = field(default_factory=dict)


class BatchRunner(Protocol):
    reads_block_tables: bool
    computes_logits: bool
    # Micro-batches in flight at most: 1 for a runner that runs one iteration at a time, up to PP for a pipeline.
    max_in_flight: int
    # The hardware limits MFU and MBU are measured against when they are published ones (a simulated
    # deployment's GPUs); None: this machine's measured limits, or none.
    machine_limits: MachineLimits | None

    @property
    def full(self) -> bool:
        """``max_in_flight`` micro-batches are in flight: the next one waits."""
        ...

    def submit(self, scheduler_output: SchedulerOutput, now: float) -> None:
        """Start a micro-batch scheduled at ``now``."""
        ...

    def pop_finished(self, now: float) -> list[FinishedBatch]:
        """The micro-batches that left the last stage by ``now`` (a real runner: whose results are back), oldest
        first."""
        ...

    def wait(self) -> bool:
        """Wait until the oldest micro-batch in flight leaves the last stage (a virtual clock jumps there);
        False, at once, when none is in flight."""
        ...

    def idle_until(self, t: float) -> None:
        """The engine had no work until ``t``: stage idle time before it is not a bubble."""
        ...

    def shutdown(self) -> None:
        """Stop the processes it runs on besides this one, if any (again: a no-op)."""
        ...


class RunnerDead(RuntimeError):
    """The runner can run no iteration any more (a worker process of a distributed runner died): the engine
    ends every request in flight with this error and stops."""
