"""The operator split of sampled iterations: the time in the linear layers and in attention.

Every ``every``-th iteration (0: never) the runner hooks its linear layers (forward pre/post hooks, removed
after the iteration) and wraps its attention backend in a stopwatch; the rest of the iteration (embedding,
norms, rotary, activations, sampling, batch preparation, scheduling) is what remains of the iteration's time.
Iterations in between run the untouched model, so sampling costs only the sampled iterations' hook time.
On CUDA the stopwatch records events and reads them after one synchronization at the iteration's end.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from stallfree.engine.model.packed_linear import PackedLinear
from stallfree.engine.model.tiled_linear import TiledLinear


@dataclass(frozen=True)
class OperatorSplit:
    linear_s: float
    attention_s: float


class Stopwatch:
    """Sums the spans between ``start()`` and ``stop()``; spans do not nest."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total, self.events = 0.0, []
        self._start = None

    def start(self, *_) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self, *_) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.total += time.perf_counter() - self._start

    def seconds(self) -> float:
        """The summed spans (on CUDA after the caller synchronized)."""
        return self.total + sum(a.elapsed_time(b) for a, b in self.events) / 1e3


class TimedBackend:
    """An attention backend whose calls a stopwatch times."""

    def __init__(self, backend, stopwatch: Stopwatch):
        self.backend, self.stopwatch = backend, stopwatch

    def __call__(self, *args, **kwargs):
        self.stopwatch.start()
        out = self.backend(*args, **kwargs)
        self.stopwatch.stop()
        return out

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


class SampledSplit:
    """One sampled iteration: ``backend`` is the attention backend to run it with; ``finish`` unhooks."""

    def __init__(self, linears: list[nn.Module], backend, device: torch.device):
        self.device = device
        self.linear, self.attention = Stopwatch(device), Stopwatch(device)
        self.backend = TimedBackend(backend, self.attention)
        self.handles = [hook for m in linears for hook in (m.register_forward_pre_hook(self.linear.start),
                                                             m.register_forward_hook(self.linear.stop))]

    def finish(self) -> OperatorSplit:
        for handle in self.handles:
            handle.remove()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return OperatorSplit(self.linear.seconds(), self.attention.seconds())


class SplitSampler:
    def __init__(self, model: nn.Module, device: torch.device, every: int):
        if not isinstance(every, int) or every < 0:
            raise ValueError(f"model.op_split_every must be an integer >= 0 (0: never), got {every!r}")
        self.device, self.every, self.count = device, every, 0
        self.linears = [m for m in model.modules() if isinstance(m, nn.Linear | PackedLinear | TiledLinear)]

    def next(self, backend) -> SampledSplit | None:
        """A SampledSplit when this iteration is sampled, else None."""
        if not self.every:
            return None
        self.count += 1
        return SampledSplit(self.linears, backend, self.device) if self.count % self.every == 0 else None
