"""What passes along a pipeline: each micro-batch's ticket (its SchedulerOutput, posted to every worker by the
driver, engine/distributed/mailbox.py) and the hidden states between stages over torch.distributed (gloo on
CPU, NCCL on CUDA). A rank sends its stage's output (the last layer's output and the residual stream) to the
rank of the next stage that holds the same tensor-parallel shard, with the busy, idle and hand-off seconds of
the stages so far and when it sent them, which the last stage hands back with the sampled tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from stallfree.engine.model.llama import Hidden
from stallfree.engine.scheduler.output import SchedulerOutput

ALIGN_BYTES = 64


@dataclass(frozen=True)
class Ticket:
    scheduler_output: SchedulerOutput
    period_start_s: float  # when the engine's busy period began: a stage's idle time before it is no bubble


class StageTimer:
    """A stage's busy, idle and hand-off seconds per micro-batch, counted as the simulator counts them
    (engine/simulator/pipeline.py): idle is the wait since the stage's previous micro-batch, within the busy
    period; hand-off the part of it after both the stage was free and the previous stage had sent the
    micro-batch (``sent_s``; stage 0 has none). Wall-clock seconds, comparable across the ranks of one machine."""

    def __init__(self) -> None:
        self.free_s = 0.0

    def time(self, start_s: float, end_s: float, period_start_s: float,
             sent_s: float | None = None) -> tuple[float, float, float]:
        idle = max(0.0, start_s - max(self.free_s, period_start_s))
        handoff = 0.0 if sent_s is None else max(0.0, start_s - max(self.free_s, period_start_s, sent_s))
        self.free_s = end_s
        return end_s - start_s, idle, handoff


class StageLink:
    """This rank's links to the previous stage (``prev_rank``) and the next one (``next_rank``); None at the ends."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device, prev_rank: int | None,
                 next_rank: int | None, max_pending: int):
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.max_pending = max_pending  # sends not yet waited for (their tensors kept alive until then)
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def send(self, hidden: Hidden, timings: list[float]) -> None:
        """Hand the micro-batch to the next stage without waiting for it to take it: the timings and both hidden
        tensors in one message, which costs one receive where three cost up to three scheduler ticks on a busy
        2-core machine (docs/performance.md, Pipeline fidelity)."""
        assert self.next_rank is not None
        parts = (torch.tensor(timings, dtype=torch.float64, device=self.device), *hidden)
        sizes = [_padded(_nbytes(t)) for t in parts]
        packed = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        for part, segment in zip(parts, packed.split(sizes), strict=True):
            segment[:_nbytes(part)].copy_(part.contiguous().view(-1).view(torch.uint8))
        self.pending.append((dist.isend(packed, self.next_rank), packed))
        while len(self.pending) > self.max_pending:
            self.pending.pop(0)[0].wait()

    def receive(self, num_tokens: int, num_timings: int) -> tuple[Hidden, list[float]]:
        """The previous stage's hidden states for ``num_tokens`` tokens and its ``num_timings`` timings (the
        stages' so far, then when it sent them)."""
        assert self.prev_rank is not None
        sizes = [num_timings * 8] + [num_tokens * self.hidden_size * self.dtype.itemsize] * 2
        padded = [_padded(size) for size in sizes]
        packed = torch.empty(sum(padded), dtype=torch.uint8, device=self.device)
        dist.recv(packed, self.prev_rank)
        timing, x, residual = (segment[:size] for segment, size in zip(packed.split(padded), sizes, strict=True))
        x, residual = (t.view(self.dtype).view(num_tokens, self.hidden_size) for t in (x, residual))
        return (x, residual), timing.view(torch.float64).tolist()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _padded(nbytes: int) -> int:
    """Each part of a packed message starts at a multiple of 64 bytes, as the native kernels' inputs do."""
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
