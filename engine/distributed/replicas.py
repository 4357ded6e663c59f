"""Data-parallel replicas behind a router (``parallel.data_parallel_size=N``): N whole engines, each in a process of
its own with an even share of the cores, and the engine's process routing each request, at its arrival time, to
one of them (``parallel.router``: engine/distributed/router.py) and relaying their outputs. The server, ``LLM``
and the in-process target drive it through LLMEngine's API.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.distributed.instance import expect_ready, send_quietly
from stallfree.engine.distributed.replica_worker import ReplicaLimits, ReplicaLoad, serve_replica
from stallfree.engine.distributed.router import ROUTERS
from stallfree.engine.distributed.workers import LocalWorkers
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.outputs import RequestOutput
from stallfree.engine.records import BatchRecord
from stallfree.engine.request import Request, RequestMetrics, SamplingParams
from stallfree.engine.request_limits import check_context_length, check_kv_budget, check_prompt_ids
from stallfree.engine.runner.base import RunnerDead
from stallfree.engine.runner.clock import WallClock
from stallfree.engine.tokenizer import load_tokenizer, prompt_token_ids

log = logging.getLogger(__name__)
IDLE_POLL_S = 0.005  # how long a step waits for a replica's message before it returns


class ReplicatedEngine:
    """LLMEngine's API over replicas. Not thread-safe: drive it from one thread."""

    def __init__(self, config: Any, workers: LocalWorkers, limits: list[ReplicaLimits]):
        self.config, self.model_name, self.workers = config, config.model.model, workers
        self.router = ROUTERS[config.parallel.router]()
        first = limits[0]
        self.max_model_len, self.vocab_size = first.max_model_len, first.vocab_size
        self.dtype_choice, self.linear_kernels = first.dtype_choice, first.linear_kernels
        self.kv_limits = min(limits, key=lambda limit: limit.num_blocks)  # the smallest cache bounds a request
        mc = config.model
        self.tokenizer, self.no_tokenizer_reason = load_tokenizer(resolve_model_path(mc.model), mc.tokenizer,
                                                                  mc.skip_tokenizer_init)
        self.clock = WallClock()
        self.upcoming: list[tuple[float, int, Request]] = []  # a heap by arrival time: not yet routed
        self._order, self._ids = itertools.count(), itertools.count()
        self.routed: dict[str, int] = {}  # request id -> its replica, until it finishes
        self.requests: dict[str, Request] = {}  # every unfinished request, routed or not
        self.last: dict[str, RequestOutput] = {}  # each routed request's latest output
        self.outstanding = [0] * len(limits)
        self.loads = [ReplicaLoad() for _ in limits]
        self.batch_records: list[BatchRecord] = []
        self.dead: str | None = None

    @classmethod
    def start(cls, config: Any, build_engine: Callable[[Any], Any]) -> ReplicatedEngine:
        """Start ``parallel.data_parallel_size`` replicas, each an engine of ``config`` with one replica, built in
        its process by ``build_engine``; ConfigError, naming the key, where this machine cannot hold them."""
        parallel = config.parallel
        num = parallel.data_parallel_size
        ROUTERS[parallel.router]  # a bad name fails before any process starts
        if (cores := len(os.sched_getaffinity(0))) < num:
            raise ConfigError(f"parallel.data_parallel_size={num} needs a CPU core per replica; this process may "
                              f"use {cores}")
        replica = dataclasses.replace(config, parallel=dataclasses.replace(parallel, data_parallel_size=1))
        workers = LocalWorkers.spawn(range(num), serve_replica, (num, replica, build_engine))
        try:
            limits = [expect_ready(workers, w.pipe, parallel.startup_timeout_s, f"replica {w.rank}")[1]
                      for w in workers.workers]
        except BaseException:
            workers.stop()
            raise
        log.info("%d data-parallel replicas, router %s", num, parallel.router)
        return cls(config, workers, limits)

    # -- LLMEngine's API ---------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.upcoming) + sum(load.num_waiting for load in self.loads)

    @property
    def num_running(self) -> int:
        return sum(load.num_running for load in self.loads)

    @property
    def num_computing_elsewhere(self) -> int:
        """Requests the replicas are computing: work while this process runs none."""
        return len(self.routed)

    def kv_usage(self) -> float:
        return sum(load.kv_usage for load in self.loads) / len(self.loads)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def reset_prefix_cache(self) -> int:
        """Empty every replica's prefix cache before its next request; 0 (the replicas do not say how many)."""
        for worker in self.workers.workers:
            send_quietly(worker.pipe, ("reset", None))
        return 0

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Check a request as a replica would and route it at its arrival time; ValueError naming the problem."""
        self.check_alive()
        params = params or SamplingParams()
        params.validate()
        token_ids = prompt_token_ids(prompt, self.tokenizer, self.no_tokenizer_reason)
        check_prompt_ids(token_ids, self.vocab_size)
        check_context_length(len(token_ids), None, self.max_model_len)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"duplicate request_id {request_id!r}")
        request = Request(request_id, token_ids, params, self.clock() if arrival_time is None else arrival_time,
                          self.max_model_len)
        check_kv_budget(request.max_num_tokens, self.kv_limits, False)
        self.requests[request_id] = request
        heapq.heappush(self.upcoming, (request.metrics.arrival_time, next(self._order), request))
        self._route_due(self.clock())
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if (replica := self.routed.pop(request_id, None)) is not None:
            self.outstanding[replica] -= 1
            send_quietly(self.workers.workers[replica].pipe, ("abort", request_id))
        else:
            self.upcoming = [entry for entry in self.upcoming if entry[2] is not request]
            heapq.heapify(self.upcoming)
        return self._final(request, "abort")

    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """The outputs the replicas sent since the last step, waiting a little for the first of them."""
        self.check_alive()
        now = self.clock()
        self._route_due(now)
        timeout = 0.0  # nothing to wait for
        if self.routed:
            timeout = IDLE_POLL_S
        elif self.upcoming:  # the next arrival, or sooner
            timeout = min(IDLE_POLL_S, max(0.0, self.upcoming[0][0] - now))
        outputs: list[RequestOutput] = []
        pipes = {worker.pipe: index for index, worker in enumerate(self.workers.workers)}
        for pipe in wait(list(pipes), timeout):
            try:
                while pipe.poll():
                    outputs += self._take(pipes[pipe], pipe.recv())
            except (EOFError, OSError, RunnerDead) as exc:
                return outputs + self._die(self.workers.wait_for_death(1.0) or str(exc))
        if (death := self.workers.first_death()) is not None:
            return outputs + self._die(death)
        self._route_due(self.clock())
        return [out for out in outputs if out.finished] if finished_only else outputs

    def pop_batch_records(self) -> list[BatchRecord]:
        records, self.batch_records = self.batch_records, []
        return records

    def check_alive(self) -> None:
        if self.dead is not None:
            raise RunnerDead(self.dead)

    def shutdown(self) -> None:
        self.workers.stop()

    # -- internals ---------------------------------------------------------------------------------

    def _route_due(self, now: float) -> None:
        while self.upcoming and self.upcoming[0][0] <= now:
            request = heapq.heappop(self.upcoming)[2]
            replica = self.router.pick(self.outstanding)
            self.routed[request.request_id] = replica
            self.outstanding[replica] += 1
            send_quietly(self.workers.workers[replica].pipe, ("add", request.request_id, request.prompt_token_ids,
                                                              request.params, request.metrics.arrival_time))

    def _take(self, replica: int, message: tuple) -> list[RequestOutput]:
        kind, *rest = message
        if kind == "died":
            raise RunnerDead(rest[0])
        outputs, records, self.loads[replica] = rest
        self.batch_records += records
        taken = []
        for out in outputs:
            if self.routed.get(out.request_id) != replica:  # aborted meanwhile
                continue
            self.last[out.request_id] = out
            taken.append(out)
            if out.finished:
                del self.routed[out.request_id], self.requests[out.request_id], self.last[out.request_id]
                self.outstanding[replica] -= 1
        return taken

    def _final(self, request: Request, reason: str, error: str | None = None) -> RequestOutput:
        """The final output of a request ended here, not by its replica: its latest output's tokens and times."""
        last = self.last.pop(request.request_id, None)
        if last is None:
            return RequestOutput(request.request_id, request.prompt_token_ids, [], [], "", True, reason,
                                 RequestMetrics(request.metrics.arrival_time), error=error)
        return dataclasses.replace(last, new_token_ids=[], finished=True, finish_reason=reason, error=error)

    def _die(self, reason: str) -> list[RequestOutput]:
        """End every unfinished request with ``reason``; later calls raise it."""
        self.dead = f"the engine stopped: {reason}"
        requests = list(self.requests.values())
        self.requests.clear()
        self.routed.clear()
        self.upcoming.clear()
        self.workers.stop()
        return [self._final(request, "error", self.dead) for request in requests]
