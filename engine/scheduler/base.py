"""The Scheduler interface, the Batch it produces, and the registry of policies."""
from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from engine.config import SchedulerConfig
from engine.kv_cache import KVCacheManager
from engine.request import Request, RequestStatus

SCHEDULERS: dict[str, type[Scheduler]] = {}


def register(cls: type[Scheduler]) -> type[Scheduler]:
    SCHEDULERS[cls.name] = cls
    return cls


def make_scheduler(config: SchedulerConfig, kv: KVCacheManager, max_model_len: int) -> Scheduler:
    if config.policy not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {config.policy!r}; choose one of {sorted(SCHEDULERS)}")
    return SCHEDULERS[config.policy](config, kv, max_model_len)


@dataclass
class ScheduledUnit:
    request: Request
    num_new_tokens: int
    is_prefill: bool

    @property
    def samples(self) -> bool:
        """Whether this unit completes the request's known tokens, so the next token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass
class Batch:
    units: list[ScheduledUnit] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(u.num_new_tokens for u in self.units if u.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(u.num_new_tokens for u in self.units if not u.is_prefill)

    @property
    def num_prefill_seqs(self) -> int:
        return sum(u.is_prefill for u in self.units)

    @property
    def num_decode_seqs(self) -> int:
        return sum(not u.is_prefill for u in self.units)


class Scheduler(ABC):
    """FCFS queue + running list; subclasses decide what one iteration contains.

    ``running`` is in admission order; preemption (by recompute) takes the newest running request.
    """

    name: ClassVar[str]
    # Uses SchedulerConfig.chunk_size as its per-iteration token budget (others ignore chunk_size).
    chunked: ClassVar[bool] = False
    # Reserve KV blocks for the worst case (prompt + max_tokens) at admission instead of growing.
    reserve_worst_case: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @abstractmethod
    def schedule(self, now: float) -> Batch:
        """Pick the units of the next iteration among requests that have arrived by ``now``."""

    def add_request(self, request: Request) -> None:
        # Keep ``waiting`` sorted by arrival so FCFS holds for replays with future arrival times.
        times = [r.metrics.arrival_time for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(times, request.metrics.arrival_time), request)

    def remove(self, request: Request) -> None:
        """Drop a finished or aborted request and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def reservation(self, request: Request) -> int:
        return request.max_num_tokens if self.reserve_worst_case else request.num_tokens

    # -- building blocks shared by the policies --------------------------------------------------

    def next_arrived(self, now: float) -> Request | None:
        if self.waiting and self.waiting[0].arrived(now):
            return self.waiting[0]
        return None

    def try_admit(self, request: Request) -> bool:
        """Move the head of the queue to running if a sequence slot and its KV blocks are available."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        if not self.kv.can_allocate(request, self.reservation(request)):
            return False
        self.kv.allocate(request, self.reservation(request))
        self.waiting.popleft()
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        return True

    def preempt(self, request: Request, batch: Batch) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.metrics.num_preemptions += 1
        self.waiting.appendleft(request)
        batch.preempted.append(request)

    def schedule_decodes(self, batch: Batch) -> None:
        """One token for every running decode, oldest first, preempting the newest when blocks run out."""
        for request in [r for r in self.running if r.is_decode]:
            if request not in self.running:  # preempted below as a victim of an older request
                continue
            while not self.kv.can_allocate(request, request.num_tokens, use_watermark=False):
                victim = self.running[-1]
                self.preempt(victim, batch)
                if victim is request:
                    break
            else:
                self.kv.allocate(request, request.num_tokens)
                batch.units.append(ScheduledUnit(request, 1, is_prefill=False))

    def schedule_prefill_chunks(self, batch: Batch, budget: int, now: float) -> None:
        """Ongoing partial prefills, then new requests FCFS, each getting min(remaining, budget left)."""
        for request in self.running:
            if budget <= 0:
                return
            if not request.is_decode:  # decodes were scheduled already (as 1-token units)
                n = min(request.num_uncomputed_tokens, budget)
                batch.units.append(ScheduledUnit(request, n, is_prefill=True))
                budget -= n
        while budget > 0 and (request := self.next_arrived(now)) is not None and self.try_admit(request):
            n = min(request.num_uncomputed_tokens, budget)
            batch.units.append(ScheduledUnit(request, n, is_prefill=True))
            budget -= n

    def admit_whole_prefills(self, batch: Batch, now: float, token_budget: int | None = None) -> None:
        """New requests FCFS with their whole prompt (no chunking), within an optional token budget."""
        while (request := self.next_arrived(now)) is not None:
            n = request.num_uncomputed_tokens
            if token_budget is not None and batch.num_prefill_tokens + n > token_budget:
                return
            if not self.try_admit(request):
                return
            batch.units.append(ScheduledUnit(request, n, is_prefill=True))
