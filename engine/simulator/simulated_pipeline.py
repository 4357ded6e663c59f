"""SimulatedPipeline: micro-batches through pipeline stages on the engine's virtual clock, the ``BatchRunner``
(engine/runner/base.py) of every simulated pipeline. A subclass says how long each stage takes on a
micro-batch (``stage_seconds``), how long each takes to take it (``handoff_seconds``, none by default) and
which tokens it samples.

The engine submits each scheduled iteration (a micro-batch), which is timed at once (engine/simulator/
pipeline.py). Its requests stay in flight, and their tokens are handed back, when it leaves the last stage. At
most ``max_in_flight`` micro-batches are in flight, as with vLLM's PP virtual engines and sarathi-serve's
pipeline. The runner advances the engine's virtual clock: to when stage 0 is free after a submit, to the
oldest micro-batch's end when the engine waits for one.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stallfree.engine.runner.base import FinishedBatch
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.pipeline import MicroBatchTiming, Pipeline
from stallfree.engine.utilization import MachineLimits, OperatorSplit


@dataclass(frozen=True)
class MicroBatch:
    output: SchedulerOutput
    sampled: dict[str, int]
    timing: MicroBatchTiming
    operator_split: OperatorSplit | None

    def finished(self, seen_s: float) -> FinishedBatch:
        timing = self.timing
        result = ModelRunnerOutput(self.sampled, operator_split=self.operator_split,
                                   stage_busy_s=list(timing.stage_busy_s), stage_idle_s=list(timing.stage_idle_s),
                                   stage_handoff_s=list(timing.stage_handoff_s))
        return FinishedBatch(self.output, result, timing.scheduled_s, seen_s)


class SimulatedPipeline:
    reads_block_tables = False  # the scheduler need not copy them into its snapshots
    computes_logits = False
    machine_limits: MachineLimits | None = None

    def __init__(self, num_stages: int, max_in_flight: int, clock: VirtualClock, op_split_every: int = 0,
                 stamped_when_popped: bool = False):
        self.clock, self.max_in_flight = clock, max_in_flight
        # False: a micro-batch's tokens are stamped when it leaves the last stage. True: when the engine pops it,
        # which after a submit is once stage 0 is free, as with the real PipelineRunner, whose submit runs
        # stage 0 in the engine's process: a result that arrives meanwhile is seen when that forward is done.
        self.stamped_when_popped = stamped_when_popped
        self.pipeline = Pipeline(num_stages)
        self.in_flight: deque[MicroBatch] = deque()
        self.op_split_every, self.iterations = op_split_every, 0

    def stage_seconds(self, output: SchedulerOutput) -> tuple[list[float], float]:
        """Each stage's busy time for this micro-batch, and the send time between stages."""
        raise NotImplementedError

    def handoff_seconds(self) -> list[float] | None:
        """Each stage's time to take the next micro-batch once it is ready and the stage is free; None: none."""
        return None

    def sample(self, output: SchedulerOutput) -> dict[str, int]:
        """The tokens of the units that sample, by request id."""
        raise NotImplementedError

    def operator_split(self, output: SchedulerOutput) -> OperatorSplit | None:
        """The micro-batch's seconds in linear layers and attention, where the simulation knows them."""
        return None

    def submit(self, output: SchedulerOutput, now: float) -> None:
        """Time the micro-batch; the clock moves on to when stage 0 can take the next one."""
        stage_s, send_s = self.stage_seconds(output)
        stage_s, send_s = [self.clock.on_grid(s) for s in stage_s], self.clock.on_grid(send_s)
        handoff_s = [self.clock.on_grid(s) for s in handoff] if (handoff := self.handoff_seconds()) else None
        self.iterations += 1
        split = self.operator_split(output) if self.op_split_every and \
            self.iterations % self.op_split_every == 0 else None
        timing = self.pipeline.submit(now, stage_s, send_s, handoff_s)
        self.in_flight.append(MicroBatch(output, self.sample(output), timing, split))
        self.clock.advance_to(self.pipeline.stage_free_s[0])

    @property
    def full(self) -> bool:
        return len(self.in_flight) >= self.max_in_flight

    def wait(self) -> bool:
        if not self.in_flight:
            return False
        self.clock.advance_to(self.in_flight[0].timing.end_s)
        return True

    def pop_finished(self, now: float) -> list[FinishedBatch]:
        done = []
        while self.in_flight and (end_s := self.in_flight[0].timing.end_s) <= now:
            done.append(self.in_flight.popleft().finished(now if self.stamped_when_popped else end_s))
        return done

    def idle_until(self, t: float) -> None:
        self.pipeline.idle_until(t)

    def shutdown(self) -> None:
        pass  # a simulation: no process to stop
