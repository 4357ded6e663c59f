"""What passes along a pipeline: each micro-batch's ticket (its SchedulerOutput, posted to every worker by the
driver, engine/distributed/mailbox.py) and the hidden states between stages over torch.distributed (gloo on
CPU, NCCL on CUDA). A rank sends its stage's output (the last layer's output and the residual stream) to the
rank of the next stage that holds the same tensor-parallel shard, with the busy and idle seconds of the stages
so far, which the last stage hands back with the sampled tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from stallfree.engine.model.llama import Hidden
from stallfree.engine.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class Ticket:
    scheduler_output: SchedulerOutput
    period_start_s: float  # when the engine's busy period began: a stage's idle time before it is no bubble


class StageTimer:
    """A stage's busy and idle seconds per micro-batch, counted as the simulator counts them
    (engine/simulator/pipeline.py): idle is the wait since the stage's previous micro-batch, within the busy
    period (wall-clock seconds, comparable across the ranks of one machine)."""

    def __init__(self) -> None:
        self.free_s = 0.0

    def time(self, start_s: float, end_s: float, period_start_s: float) -> tuple[float, float]:
        idle = max(0.0, start_s - max(self.free_s, period_start_s))
        self.free_s = end_s
        return end_s - start_s, idle


class StageLink:
    """This rank's links to the previous stage (``prev_rank``) and the next one (``next_rank``); None at the ends."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device, prev_rank: int | None,
                 next_rank: int | None, max_pending: int):
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.max_pending = max_pending  # sends not yet waited for (their tensors kept alive until then)
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def send(self, hidden: Hidden, timings: list[float]) -> None:
        """Hand the micro-batch to the next stage without waiting for it to take it."""
        assert self.next_rank is not None
        timing = torch.tensor(timings, dtype=torch.float64, device=self.device)
        for tensor in (*hidden, timing):
            tensor = tensor.contiguous()
            self.pending.append((dist.isend(tensor, self.next_rank), tensor))
        while len(self.pending) > 3 * self.max_pending:
            self.pending.pop(0)[0].wait()

    def receive(self, num_tokens: int, num_timings: int) -> tuple[Hidden, list[float]]:
        """The previous stage's hidden states for ``num_tokens`` tokens and its ``num_timings`` timings."""
        assert self.prev_rank is not None
        x, residual = (torch.empty(num_tokens, self.hidden_size, dtype=self.dtype, device=self.device)
                       for _ in range(2))
        timing = torch.empty(num_timings, dtype=torch.float64, device=self.device)
        for tensor in (x, residual, timing):
            dist.recv(tensor, self.prev_rank)
        return (x, residual), timing.tolist()
