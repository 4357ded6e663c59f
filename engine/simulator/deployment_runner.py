"""DeploymentRunner: a GPU deployment's iterations as micro-batches through its pipeline stages, timed by the
operator cost model, on the engine's virtual clock (engine/simulator/simulated_pipeline.py).

Stage i runs ``stage_layers[i]`` layers (the first also the embedding and the iteration's CPU overhead, the
last the final norm, LM head and sampling), and activations cross each stage boundary in ``pp_send_seconds``.
"""
from __future__ import annotations

import random

from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.deployment import Deployment, Resolved
from stallfree.engine.simulator.simulated_pipeline import SimulatedPipeline
from stallfree.engine.utilization import MachineLimits, OperatorSplit


class DeploymentRunner(SimulatedPipeline):
    def __init__(self, deployment: Deployment, resolved: Resolved, seed: int, clock: VirtualClock,
                 op_split_every: int = 0):
        super().__init__(deployment.pp, deployment.max_in_flight or deployment.pp, clock, op_split_every)
        self.deployment, self.cost_model, self.stage_batch_of = deployment, resolved.cost_model, resolved.stage_batch_of
        self.stage_layers = deployment.stage_layers(resolved.shape.num_layers)
        self.vocab_size = resolved.shape.vocab_size
        self.rng = random.Random(seed)
        # MFU / MBU against the GPUs of one stage (TP of them): a micro-batch's stages run one after another,
        # so its model FLOPs over its time and one stage's peak is the utilisation of the GPUs while they work.
        gpu = resolved.gpu
        self.machine_limits = MachineLimits(f"{gpu.name} x{deployment.tp} (TP{deployment.tp}-PP{deployment.pp})",
                                            "bfloat16", gpu.peak_tflops_bf16 * 1e12 * deployment.tp,
                                            gpu.mem_bandwidth_gbps * 1e9 * deployment.tp, "published")

    def stage_seconds(self, output: SchedulerOutput) -> tuple[list[float], float]:
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

    def sample(self, output: SchedulerOutput) -> dict[str, int]:
        # One random token for the whole micro-batch: ids never matter to a simulation (a shape has no EOS).
        return dict.fromkeys((u.request_id for u in output.units if u.samples), self.rng.randrange(self.vocab_size))

    def operator_split(self, output: SchedulerOutput) -> OperatorSplit:
        """The micro-batch's seconds in linear layers and attention over all its stages, from the cost model."""
        batch, last = self.stage_batch_of(output), len(self.stage_layers) - 1
        parts = [self.cost_model.split_seconds(batch, layers, last=stage == last)
                 for stage, layers in enumerate(self.stage_layers)]
        return OperatorSplit(sum(p[0] for p in parts), sum(p[1] for p in parts))
