"""The driver <-> worker messages: each iteration's SchedulerOutput from the driver to every rank, and a
ModelRunnerOutput back from the rank that samples, pickled over the gloo control group."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput

DRIVER = 0


class Channel:
    def __init__(self, group: Any):
        self.group = group

    def send_batch(self, batch: SchedulerOutput | None) -> None:
        """Driver: hand the iteration to every rank (None: stop)."""
        dist.broadcast_object_list([batch], src=DRIVER, group=self.group)

    def receive_batch(self) -> SchedulerOutput | None:
        """Worker: the driver's next iteration, or None when it stops."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=DRIVER, group=self.group)
        return box[0]

    def send_output(self, output: ModelRunnerOutput, dst: int = DRIVER) -> None:
        dist.send_object_list([output], dst=dst, group=self.group)

    def receive_output(self, src: int) -> ModelRunnerOutput:
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src, group=self.group)
        return box[0]

    def min_over_ranks(self, value: int) -> int:
        """The smallest ``value`` of all ranks (e.g. the KV blocks each rank's memory holds)."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())
