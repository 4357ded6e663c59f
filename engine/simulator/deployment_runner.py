"""DeploymentRunner: a deployment's iterations as micro-batches through its pipeline stages, timed by the
operator cost model, on the engine's virtual clock.

The engine submits each scheduled iteration (a micro-batch), which is timed at once: stage i runs
``stage_layers[i]`` layers (the first also the embedding and the iteration's CPU overhead, the last the
final norm, LM head and sampling), and activations cross each stage boundary in ``pp_send_seconds``. Its
requests stay in flight, and their tokens are handed back, when it leaves the last stage. At most PP
micro-batches are in flight, as with vLLM's PP virtual engines and sarathi-serve's pipeline. The runner
advances the engine's virtual clock: to when stage 0 is free after a submit, to the oldest micro-batch's end
when the engine waits for one (the ``BatchRunner`` protocol, engine/runner/base.py).
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from stallfree.engine.runner.base import FinishedBatch
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.deployment import Deployment, Resolved
from stallfree.engine.simulator.pipeline import MicroBatchTiming, Pipeline
from stallfree.engine.utilization import MachineLimits, OperatorSplit


@dataclass(frozen=True)
class MicroBatch:
    output: SchedulerOutput
    sampled: dict[str, int]
    timing: MicroBatchTiming
    operator_split: OperatorSplit | None

    def finished(self) -> FinishedBatch:
        timing = self.timing
        result = ModelRunnerOutput(self.sampled, operator_split=self.operator_split,
                                   stage_busy_s=list(timing.stage_busy_s), stage_idle_s=list(timing.stage_idle_s))
        return FinishedBatch(self.output, result, timing.scheduled_s, timing.end_s)


class DeploymentRunner:
    reads_block_tables = False  # the scheduler need not copy them into its snapshots
    computes_logits = False

    def __init__(self, deployment: Deployment, resolved: Resolved, seed: int, clock: VirtualClock,
                 op_split_every: int = 0):
        self.clock = clock
        self.deployment, self.cost_model, self.stage_batch_of = deployment, resolved.cost_model, resolved.stage_batch_of
        self.stage_layers = deployment.stage_layers(resolved.shape.num_layers)
        self.vocab_size = resolved.shape.vocab_size
        self.pipeline = Pipeline(deployment.pp)
        self.in_flight: deque[MicroBatch] = deque()
        self.rng = random.Random(seed)
        # MFU / MBU against the GPUs of one stage (TP of them): a micro-batch's stages run one after another,
        # so its model FLOPs over its time and one stage's peak is the utilisation of the GPUs while they work.
        gpu = resolved.gpu
        self.machine_limits = MachineLimits(f"{gpu.name} x{deployment.tp} (TP{deployment.tp}-PP{deployment.pp})",
                                            "bfloat16", gpu.peak_tflops_bf16 * 1e12 * deployment.tp,
                                            gpu.mem_bandwidth_gbps * 1e9 * deployment.tp, "published")
        self.op_split_every, self.iterations = op_split_every, 0
        self.max_in_flight = deployment.max_in_flight or deployment.pp

    def stage_seconds(self, output: SchedulerOutput) -> tuple[list[float], float]:
        """Each stage's busy time for this micro-batch, and the send time between stages."""
        batch, model, last = self.stage_batch_of(output), self.cost_model, len(self.stage_layers) - 1
        by_kind: dict[tuple[int, bool, bool], float] = {}  # middle stages of equal depth cost the same
        seconds = []
        for stage, layers in enumerate(self.stage_layers):
            kind = (layers, stage == 0, stage == last)
            if kind not in by_kind:
                by_kind[kind] = model.stage_seconds(batch, layers, first=kind[1], last=kind[2])
            seconds.append(by_kind[kind])
        seconds[0] += model.cpu_overhead_seconds(batch)
        send = model.pp_send_seconds(batch.num_tokens) if last else 0.0
        return seconds, send

    def submit(self, output: SchedulerOutput, now: float) -> None:
        """Time the micro-batch; the clock moves on to when stage 0 can take the next one."""
        stage_s, send_s = self.stage_seconds(output)
        self.iterations += 1
        split = self.operator_split(output) if self.op_split_every and \
            self.iterations % self.op_split_every == 0 else None
        timing = self.pipeline.submit(now, stage_s, send_s)
        # One random token for the whole micro-batch: ids never matter to a simulation (a shape has no EOS).
        sampled = dict.fromkeys((u.request_id for u in output.units if u.samples), self.rng.randrange(self.vocab_size))
        self.in_flight.append(MicroBatch(output, sampled, timing, split))
        self.clock.advance_to(self.pipeline.stage_free_s[0])

    def operator_split(self, output: SchedulerOutput) -> OperatorSplit:
        """The micro-batch's seconds in linear layers and attention over all its stages, from the cost model."""
        batch, last = self.stage_batch_of(output), len(self.stage_layers) - 1
        parts = [self.cost_model.split_seconds(batch, layers, last=stage == last)
                 for stage, layers in enumerate(self.stage_layers)]
        return OperatorSplit(sum(p[0] for p in parts), sum(p[1] for p in parts))

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
        while self.in_flight and self.in_flight[0].timing.end_s <= now:
            done.append(self.in_flight.popleft().finished())
        return done

    def idle_until(self, t: float) -> None:
        self.pipeline.idle_until(t)
