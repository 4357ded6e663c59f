"""Prefill on an instance of its own (``parallel.disaggregation=1p1d``), as the decode instance sees it.

The engine in the front end's process is the decode instance. A request added to it goes to the prefill
instance first (engine/distributed/prefill_worker.py); when its prompt's KV comes back over torch.distributed
(gloo), it is written into the decode instance's prefix cache (engine/distributed/kv_transfer.py) and the
request joins the decode scheduler, which takes those blocks as cache hits: it computes the prompt's last
block (at most ``cache.block_size`` tokens, at least the last one) and samples every output token. KV that does
not fit the free blocks waits, in arrival order, until it does; its blocks stay held until the request is
admitted.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.distributed.instance import expect_ready, send_quietly
from stallfree.engine.distributed.kv_transfer import PrefixKv, import_prefix
from stallfree.engine.distributed.prefill_worker import (
    DECODE_RANK,
    PREFILL_RANK,
    WORLD_SIZE,
    kv_link,
    serve_prefill,
)
from stallfree.engine.distributed.rank_runner import use_cores
from stallfree.engine.distributed.workers import LocalWorkers, WorkerDied
from stallfree.engine.records import BatchRecord
from stallfree.engine.request import Request, RequestStatus

log = logging.getLogger(__name__)


def prepare_decode_instance(config: Any, device: torch.device) -> None:
    """Before the decode instance's model is built in this process: ConfigError, naming the keys, where this
    machine cannot hold both instances (the other sections' keys are EngineConfig's to check); else this
    process's CPU threads become one instance's share of the cores."""
    keys = f"parallel.disaggregation={config.parallel.disaggregation}"
    if device.type != "cpu":
        raise ConfigError(f"{keys} runs on the CPU (gloo) only; model.device={device.type}")
    if (cores := len(os.sched_getaffinity(0))) < WORLD_SIZE:
        raise ConfigError(f"{keys} needs a CPU core per instance ({WORLD_SIZE}); this process may use {cores}")
    use_cores(WORLD_SIZE)


class RemotePrefill:
    """The decode instance's end of the prefill instance: requests out, their prompts' KV in."""

    def __init__(self, workers: LocalWorkers):
        self.workers = workers
        self.link: dist.ProcessGroupGloo | None = None
        self.pipe = workers.workers[0].pipe
        self.upcoming: list[tuple[float, int, Request]] = []  # a heap by arrival time: not yet sent
        self._order = itertools.count()  # ties in arrival time keep their order
        self.pending: dict[str, Request] = {}  # sent to the prefill instance; KV not here yet
        self.arrived: deque[tuple[PrefixKv, Request]] = deque()  # KV here, waiting for free blocks
        self.held: dict[str, list[int]] = {}  # blocks held for a request until it is admitted
        self.batch_records: list[BatchRecord] = []  # the prefill instance's, as they come (taken by the engine)

    @classmethod
    def start(cls, config: Any, build_engine: Callable[[Any], Any]) -> RemotePrefill:
        """Start the prefill instance (an engine of ``config`` without disaggregation, built in its process by
        ``build_engine``) and join it in a gloo group of two."""
        timeout_s = config.parallel.startup_timeout_s
        store = dist.TCPStore("127.0.0.1", 0, WORLD_SIZE, is_master=True, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        prefill_config = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel,
                                                                                  disaggregation=None))
        workers = LocalWorkers.spawn([PREFILL_RANK], serve_prefill, (store.port, timeout_s, prefill_config,
                                                                     build_engine))
        remote = cls(workers)
        try:
            expect_ready(workers, remote.pipe, timeout_s, "the prefill instance")
            remote.link = kv_link(store, DECODE_RANK, timeout_s)
        except BaseException:
            remote.shutdown()
            raise
        log.info("disaggregated 1p1d: prefill instance pid %d, decode instance pid %d, KV over gloo",
                 workers.workers[0].process.pid, os.getpid())
        return remote

    # -- requests ----------------------------------------------------------------------------------

    def submit(self, request: Request, now: float) -> None:
        """Send ``request`` to the prefill instance at its arrival time (now, or when a step finds it due)."""
        heapq.heappush(self.upcoming, (request.metrics.arrival_time, next(self._order), request))
        self._send_due(now)

    def _send_due(self, now: float) -> None:
        while self.upcoming and self.upcoming[0][0] <= now:
            request = heapq.heappop(self.upcoming)[2]
            self.pending[request.request_id] = request
            send_quietly(self.pipe, ("add", request.request_id, request.prompt_token_ids))

    def reset_prefix_cache(self) -> None:
        """Empty the prefill instance's prefix cache before it takes its next request."""
        send_quietly(self.pipe, ("reset", None))

    def abort(self, request_id: str, now: float) -> Request | None:
        """End a request not yet handed to the decode scheduler, aborted; None if it is not here."""
        if request_id in self.pending:
            send_quietly(self.pipe, ("abort", request_id))
            return _end(self.pending.pop(request_id), RequestStatus.FINISHED_ABORTED, now)
        for queue in (self.upcoming, self.arrived):  # the request is each entry's last item
            for index, entry in enumerate(queue):
                if entry[-1].request_id == request_id:
                    del queue[index]
                    heapq.heapify(self.upcoming)
                    return _end(entry[-1], RequestStatus.FINISHED_ABORTED, now)
        return None

    def end_all(self, now: float) -> list[Request]:
        """End every request not yet handed to the decode scheduler with an error (the engine stopped)."""
        requests = [*(entry[-1] for entry in (*self.upcoming, *self.arrived)), *self.pending.values()]
        self.upcoming.clear()
        self.pending.clear()
        self.arrived.clear()
        return [_end(request, RequestStatus.FINISHED_ERROR, now) for request in requests]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.pending or any(entry[-1].request_id == request_id
                                                 for entry in (*self.upcoming, *self.arrived))

    @property
    def num_waiting(self) -> int:
        """Requests not yet handed to the decode scheduler."""
        return len(self.upcoming) + len(self.pending) + len(self.arrived)

    @property
    def num_computing(self) -> int:
        """Requests the prefill instance has and has not sent back."""
        return len(self.pending)

    # -- the decode instance's step ------------------------------------------------------------------

    def deliver(self, kv: Any, runner: Any, add: Callable[[Request], None], clock: Callable[[], float],
                timeout_s: float = 0.0) -> list[tuple[Request, str]]:
        """Take in what the prefill instance sent (waiting up to ``timeout_s`` for the first message), write the
        KV that fits into ``kv``'s cache and ``add`` its requests; the requests the prefill instance failed on,
        with the error. Transfers are timed on the engine's ``clock``. WorkerDied when the prefill instance is
        gone."""
        failed, now = [], clock()
        self._send_due(now)
        if self.upcoming and not self.pending:  # nothing to wait for before the next arrival
            timeout_s = min(timeout_s, max(0.0, self.upcoming[0][0] - now))
        if not self.pipe.poll(timeout_s):
            self.workers.check()
        while self.pipe.poll():
            try:
                kind, *rest = self.pipe.recv()
            except (EOFError, OSError):
                raise WorkerDied(self.workers.wait_for_death(1.0) or "the prefill instance closed its pipe") from None
            if kind == "died":
                self.workers.wait_for_death(1.0)
                raise WorkerDied(rest[0])
            request_id, *rest = rest
            self.batch_records += rest[-1]
            request = self.pending.pop(request_id, None)
            if kind == "failed":
                if request is not None:
                    failed.append((_end(request, RequestStatus.FINISHED_ERROR, clock()), rest[0]))
                continue
            num_tokens, shape, dtype, _ = rest
            tensor = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
            start = clock()
            if num_tokens:
                self.link.recv([tensor], PREFILL_RANK, 0).wait()  # every one announced, aborted or not: the stream stays in step
            if request is None:  # aborted meanwhile
                continue
            request.metrics.kv_transfer_bytes = tensor.numel() * tensor.element_size()
            request.metrics.kv_transfer_start, request.metrics.kv_transfer_end = start, clock()
            self.arrived.append((PrefixKv(request.prompt_token_ids[:num_tokens], tensor, kv.block_size), request))
        self._send_due(clock())
        while self.arrived:
            prefix, request = self.arrived[0]
            blocks = import_prefix(kv, runner, prefix)
            if blocks is None:
                break
            self.arrived.popleft()
            self.held[request.request_id] = blocks
            add(request)
        return failed

    def release_admitted(self, kv: Any, requests: dict[str, Request]) -> None:
        """Let go of the blocks held for requests the decode scheduler has admitted or ended."""
        for request_id in [r for r in self.held if r not in requests or r in kv.block_tables]:
            kv.let_go(self.held.pop(request_id))

    def shutdown(self) -> None:
        self.workers.stop()
        self.link = None


def _end(request: Request, status: RequestStatus, now: float) -> Request:
    """End a request the decode scheduler never held."""
    request.status = status
    request.metrics.finish_time = now
    return request
