"""The ``Runner`` protocol: what the engine asks of the thing that executes one iteration."""
from __future__ import annotations

from typing import Protocol

from stallfree.engine.scheduler.output import SchedulerOutput


class Runner(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        """Run one iteration; return the sampled token id of every unit that samples, by request id."""
        ...
