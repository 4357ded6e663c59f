"""What the HTTP side hands the engine thread (engine/server/loop.py), and the errors it gets back."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from stallfree.engine import LLMEngine, SamplingParams


class EngineDead(RuntimeError):
    """The engine thread is not running (it died, or the server is shutting down)."""


class EngineFailed(RuntimeError):
    """engine.step raised while the request was in the engine and the request was dropped: the step
    failed on this request alone (the engine ended it), or it raised outside the runner (every request
    in the engine is failed)."""


class QueueFull(RuntimeError):
    """Admitting the request would exceed max_waiting."""


@dataclass(eq=False)
class Submission:
    """The engine requests of one HTTP request (one per prompt).

    The engine thread puts on ``queue``: ``None`` once all are added, then lists of
    (prompt index, RequestOutput) per iteration; or one exception that ends the submission.
    """

    request_ids: list[str]
    prompts: list[list[int]]
    params: list[SamplingParams]
    arrival_time: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class Abort:
    request_id: str
    reason: str  # finish reason for the metrics: "abort" (client gone) or "stop" (stop string)


@dataclass(eq=False)
class EngineCall:
    """``fn(engine)`` to run on the engine thread between steps; its result (or exception) goes to ``future``."""

    fn: Callable[[LLMEngine], object]
    future: asyncio.Future
