"""The Scheduler interface, the registry of policies, and the bookkeeping every policy shares.

A policy only decides what one iteration contains (``build_batch``); ``schedule`` turns that into the
``SchedulerOutput`` snapshot a runner executes, and ``update_from_output`` applies the step's result.
"""
from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from stallfree.engine.config import SchedulerConfig
from stallfree.engine.kv_cache import KVCacheManager
from stallfree.engine.registry import Registry
from stallfree.engine.request import Request, RequestStatus
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput

SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler")


def make_scheduler(config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                   eos_token_ids: set[int]) -> Scheduler:
    return SCHEDULERS[config.policy](config, kv, max_model_len, eos_token_ids)


@dataclass(slots=True)
class PlannedChunk:
    """A policy's choice of prompt tokens for one request, before it is snapshotted into a ``ScheduledUnit``."""

    request: Request
    num_new_tokens: int


@dataclass
class Batch:
    """What a policy builds for one iteration."""

    decodes: list[Request] = field(default_factory=list)  # one new token each
    chunks: list[PlannedChunk] = field(default_factory=list)  # prefill chunks (or whole prompts)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class Scheduler(ABC):
    """FCFS queue + running list; subclasses decide what one iteration contains.

    ``running`` is in admission order; preemption (by recompute) takes the newest running request.

    A scheduled request is *in flight* until its step's result is applied (``update_from_output``). With
    one step at a time (every runner but a pipelined simulation) nothing is in flight when a step is
    scheduled. With pipeline parallelism several micro-batches are in flight at once; their requests are
    neither scheduled again nor preempted until their micro-batch leaves the last stage.
    """

    # Uses SchedulerConfig.chunk_size as its per-iteration token budget (others ignore chunk_size).
    chunked: ClassVar[bool] = False
    # Reserve KV blocks for the worst case (prompt + max_tokens) at admission instead of growing.
    reserve_worst_case: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int, eos_token_ids: set[int]):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, waiting or running
        self.finished_request_ids: list[str] = []  # since the last step
        self.in_flight: set[str] = set()  # ids of requests scheduled in a step whose result is not applied yet
        # Snapshot each unit's block table (the model runner reads it; the simulated runners do not, and a
        # decode's table copy is as long as its context / block_size).
        self.snapshot_block_tables = True

    @abstractmethod
    def build_batch(self, now: float) -> Batch:
        """Pick the units of the next iteration among requests that have arrived by ``now``."""

    def schedule(self, now: float) -> SchedulerOutput:
        """The next iteration, as the snapshot a runner executes: decodes first (the runner's token layout).

        Units are built inline, without a method call each: one is built per running request per step, the
        simulator's hot path (docs/performance.md)."""
        batch = self.build_batch(now)
        units, add_in_flight = [], self.in_flight.add
        tables = self.kv.block_tables if self.snapshot_block_tables else None
        for request in batch.decodes:  # its one new token is its last output; it was scheduled before
            request_id = request.request_id
            units.append(ScheduledUnit(request_id, request.output_token_ids[-1:], request.num_computed_tokens,
                                       False, True, [] if tables is None else list(tables[request_id]),
                                       request.params))
            add_in_flight(request_id)
        for chunk in batch.chunks:
            request, n = chunk.request, chunk.num_new_tokens
            request_id, start = request.request_id, request.num_computed_tokens
            units.append(ScheduledUnit(request_id, request.token_ids(start, start + n), start, True,
                                       start + n == request.num_tokens,
                                       [] if tables is None else list(tables[request_id]), request.params,
                                       self._prompt_targets(request, n)))
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
            add_in_flight(request_id)
        finished, self.finished_request_ids = self.finished_request_ids, []
        return SchedulerOutput(units, [r.request_id for r in batch.preempted], finished)

    @staticmethod
    def _prompt_targets(request: Request, n: int) -> tuple[int, ...]:
        """The prompt tokens a unit of ``n`` tokens scores for prompt_logprobs; none once all are scored
        (a recompute after preemption scores nothing twice)."""
        start, scored = request.num_computed_tokens, request.prompt_logprobs
        if scored is None or len(scored) != start + 1 or start + 1 >= request.num_prompt_tokens:
            return ()
        return tuple(request.prompt_token_ids[start + 1:min(start + n + 1, request.num_prompt_tokens)])

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, int], now: float) -> list[Request]:
        """Apply a step's result: advance each unit's computed tokens, append the sampled tokens (stamped
        ``now``) and finish requests that hit a stop condition. Returns the requests that got a token."""
        updated, requests, discard_in_flight = [], self.requests, self.in_flight.discard
        # With prefix caching, a step that fills a block offers it to the cache (one decode step in block_size).
        block_size = self.kv.block_size if self.kv.caches_prefixes else 0
        for unit in output.units:
            request_id = unit.request_id
            discard_in_flight(request_id)
            request = requests.get(request_id)
            if request is None:  # aborted while its step was in flight
                continue
            computed = request.num_computed_tokens = request.num_computed_tokens + len(unit.token_ids)
            if block_size and computed // block_size > unit.num_computed_tokens // block_size:
                self.kv.cache_computed(request)
            token = sampled.get(request_id)
            if token is None:
                continue
            request.append_output(token)
            metrics = request.metrics
            metrics.token_times.append(now)
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            status = self._stop_status(request, token)
            if status is not None:
                self.finish(request, status, now)
            updated.append(request)
        return updated

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        p = request.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return RequestStatus.FINISHED_STOPPED
        if request.num_tokens >= request.max_num_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish(self, request: Request, status: RequestStatus, now: float) -> None:
        """End a request (stopped, length or aborted): drop it from the queues and free its blocks."""
        request.status = status
        request.metrics.finish_time = now
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        del self.requests[request.request_id]
        self.in_flight.discard(request.request_id)
        self.finished_request_ids.append(request.request_id)

    def next_arrival_time(self) -> float | None:
        """When the first waiting request arrives (None when nothing waits)."""
        return self.waiting[0].metrics.arrival_time if self.waiting else None

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        # Keep ``waiting`` sorted by arrival so FCFS holds for replays with future arrival times (a replay adds
        # its requests in arrival order: appending those keeps adding them linear).
        arrival, waiting = request.metrics.arrival_time, self.waiting
        if not waiting or waiting[-1].metrics.arrival_time <= arrival:
            waiting.append(request)
            return
        times = [r.metrics.arrival_time for r in waiting]
        waiting.insert(bisect.bisect_right(times, arrival), request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def reservation(self, request: Request) -> int:
        return request.max_num_tokens if self.reserve_worst_case else request.num_tokens

    # -- building blocks shared by the policies --------------------------------------------------

    def schedulable(self) -> list[Request]:
        """The running requests not in flight: those a step may schedule or preempt."""
        if not self.in_flight:
            return self.running
        return [r for r in self.running if r.request_id not in self.in_flight]

    def next_arrived(self, now: float) -> Request | None:
        if self.waiting and self.waiting[0].arrived(now):
            return self.waiting[0]
        return None

    def try_admit(self, request: Request) -> bool:
        """Move the head of the queue to running if a sequence slot and its KV blocks are available (a cached
        prefix counts as computed from then on)."""
        if len(self.running) >= self.config.max_num_seqs:
            return False
        if not self.kv.try_allocate(request, self.reservation(request)):
            return False
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
        decodes, try_allocate = batch.decodes, self.kv.try_allocate
        for request in [r for r in self.schedulable() if r.is_decode]:
            if request.status is not RequestStatus.RUNNING:  # preempted below as a victim of an older request
                continue
            while not try_allocate(request, request.num_tokens, use_watermark=False):
                victim = self.schedulable()[-1]  # not empty: ``request`` itself is schedulable
                self.preempt(victim, batch)
                if victim is request:
                    break
            else:
                decodes.append(request)

    def schedule_prefill_chunks(self, batch: Batch, budget: int, now: float) -> None:
        """Ongoing partial prefills, then new requests FCFS, each getting min(remaining, budget left)."""
        for request in self.schedulable():
            if budget <= 0:
                return
            if not request.is_decode:  # decodes were scheduled already (as 1-token units)
                n = min(request.num_uncomputed_tokens, budget)
                batch.chunks.append(PlannedChunk(request, n))
                budget -= n
        while budget > 0 and (request := self.next_arrived(now)) is not None and self.try_admit(request):
            n = min(request.num_uncomputed_tokens, budget)
            batch.chunks.append(PlannedChunk(request, n))
            budget -= n

    def admit_whole_prefills(self, batch: Batch, now: float, token_budget: int | None = None) -> None:
        """New requests FCFS with their whole prompt (no chunking) less its cached prefix, within an optional
        token budget."""
        while (request := self.next_arrived(now)) is not None:
            if token_budget is not None:
                n = request.num_uncomputed_tokens - self.kv.cached_prefix_tokens(request)
                if batch.num_prefill_tokens + n > token_budget:
                    return
            if not self.try_admit(request):
                return
            batch.chunks.append(PlannedChunk(request, request.num_uncomputed_tokens))
