"""``target=inprocess``: the workload replayed straight into an ``LLMEngine`` in this process (no HTTP),
open loop on the engine clock.

Every request is added up front with ``arrival_time = t0 + send_offset_s`` (under ``arrival.max_concurrency``,
as a slot frees, arriving then or at its time); the policies only admit requests that have arrived, so
arrivals are gated on the engine clock. The loop steps the engine and,
when nothing was runnable and the next arrival is still ahead, sleeps until it. There is no network,
so a record's "client" times are the engine's own (send = arrival, token times = when each step ended).
Only the engine's public API is used: step() outputs, abort(), batch_records and clock().
"""
from __future__ import annotations

import bisect
import gc
import heapq
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records import RequestRecord, session_ended
from stallfree.engine.records.request_spec import RequestSpec, session_groups
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import model_vocab_size
from stallfree.loadgen.targets.base import ENGINE_SHAPE, TARGETS, Progress, Replay

if TYPE_CHECKING:
    from stallfree.engine import RequestMetrics

START_DELAY_S = 0.01  # t0 a little ahead of now, so the first request is not late on arrival
TIMEOUT_ERROR = "unfinished within timeout_s of its arrival"


def _end(record: RequestRecord, status: str, error: str | None, finish_time: float,
         metrics: RequestMetrics | None) -> None:
    """Close the record with the engine's RequestMetrics as last reported (None: it never reported one)."""
    if metrics is not None:
        record.token_times = list(metrics.token_times)
        record.server_first_scheduled_time = metrics.first_scheduled_time
        record.num_preemptions = metrics.num_preemptions
        record.cached_tokens = metrics.num_cached_tokens
        record.kv_transfer_bytes = metrics.kv_transfer_bytes
        record.kv_transfer_start, record.kv_transfer_end = metrics.kv_transfer_start, metrics.kv_transfer_end
    record.server_token_times = record.token_times
    record.server_finish_time = finish_time
    record.end(status, error, finish_time)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block: on a virtual clock its collections, which scan every
    live record, took a fifth of a replay's CPU time, and a replay leaves no reference cycles for it to free."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay(engine, specs: Sequence[RequestSpec], *, warmup: int = 0, timeout_s: float | None = None,
           max_concurrency: int | None = None, progress: Progress | None = None, pause_gc: bool = False) -> Replay:
    """Run ``specs`` through ``engine`` (greedy, ``ignore_eos``): records in spec order, and the
    engine's iterations of this replay (``LLMEngine.batch_records``).

    * ``warmup``: the first ``warmup`` requests are marked ``is_warmup``.
    * ``timeout_s``: a request still unfinished this long after its arrival is aborted with status
      ``timeout``; a request the engine rejects, or ends because a step failed on it, becomes an
      ``error`` record (the others run on).
    * ``max_concurrency``: at most this many requests added and not ended; the next one in send order
      arrives when its time has come and a request has ended (its ``client_wait_s``: how much later).
    * ``progress(record)`` is called as each request ends.
    * ``pause_gc``: the cyclic garbage collector is off during the replay (``cyclic_gc_paused``).
    """
    with cyclic_gc_paused() if pause_gc else nullcontext():
        return _replay(engine, specs, warmup, timeout_s, max_concurrency, progress)


def _replay(engine, specs: Sequence[RequestSpec], warmup: int, timeout_s: float | None,
            max_concurrency: int | None, progress: Progress | None) -> Replay:
    from stallfree.engine import SamplingParams

    first_batch = len(engine.batch_records)
    on_grid = engine.clock.on_grid  # a virtual clock's sends fall on its ticks, like its iterations' ends
    t0 = on_grid(engine.clock() + START_DELAY_S)
    records = [RequestRecord.unsent(spec, intended_send_time=t0 + on_grid(spec.send_offset_s), is_warmup=i < warmup)
               for i, spec in enumerate(specs)]
    in_flight: dict[str, RequestRecord] = {}
    index = {spec.request_id: i for i, spec in enumerate(specs)}
    # (intended send, index) of the requests due to be added: each first turn now, a follow-up as the turn
    # before it ends (stallfree.engine.records.request_spec.session_groups)
    groups = session_groups(specs)
    unsent = [(records[turns[0]].intended_send_time, turns[0]) for turns in groups]
    heapq.heapify(unsent)
    next_turn = {turns[k]: turns[k + 1] for turns in groups for k in range(len(turns) - 1)}
    arrivals: list[float] = []  # of the requests added, sorted
    by_arrival: list[tuple[float, str]] = []  # a heap: the oldest arrival in flight first
    cap = max_concurrency or len(specs)

    def send(now: float) -> None:
        """Add the next requests in send order while a slot is free, each at its time or ``now``."""
        while unsent and len(in_flight) < cap:
            i = heapq.heappop(unsent)[1]
            spec, record = specs[i], records[i]
            arrival = max(record.intended_send_time, now)
            record.mark_sent(arrival)
            record.server_arrival_time = arrival
            if max_concurrency is not None:
                record.client_wait_s = arrival - record.intended_send_time
            params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
            try:
                engine.add_request(spec.prompt_token_ids, params, request_id=spec.request_id, arrival_time=arrival)
            except ValueError as e:
                record.end("error", f"rejected by the engine: {e}", arrival)
                if progress is not None:
                    progress(record)
                follow_up(i, record)
                continue
            in_flight[spec.request_id] = record
            bisect.insort(arrivals, arrival)
            heapq.heappush(by_arrival, (arrival, spec.request_id))

    def done(request_id: str, status: str, error: str | None, finish_time: float,
             metrics: RequestMetrics | None) -> None:
        record = in_flight.pop(request_id)
        _end(record, status, error, finish_time, metrics)
        if progress is not None:
            progress(record)
        follow_up(index[request_id], record)
        send(finish_time)

    def follow_up(i: int, record: RequestRecord) -> None:
        """The session's next turn comes due its think time after this one ended, unless this one failed."""
        if (k := next_turn.get(i)) is None:
            return
        records[k].intended_send_time = on_grid(record.finish_time + specs[k].think_time_s)
        if record.status == "ok":
            heapq.heappush(unsent, (records[k].intended_send_time, k))
            return
        first_unsent = records[k].intended_send_time
        while k is not None:
            records[k].intended_send_time = first_unsent
            records[k].error = session_ended(record)
            if progress is not None:
                progress(records[k])
            k = next_turn.get(k)

    send(t0)
    while in_flight:
        before, iterations = engine.clock(), len(engine.batch_records)
        for out in engine.step(finished_only=True):
            # out.error: the engine ended this request alone (its step failed on it)
            status, error = ("error", f"failed in the engine: {out.error}") if out.error else ("ok", None)
            done(out.request_id, status, error, out.metrics.finish_time, out.metrics)
        if timeout_s is not None:
            deadline = engine.clock() - timeout_s
            while by_arrival and by_arrival[0][0] < deadline:
                if (request_id := heapq.heappop(by_arrival)[1]) in in_flight:
                    aborted = engine.abort(request_id)
                    done(request_id, "timeout", TIMEOUT_ERROR, engine.clock(), aborted and aborted.metrics)
        if len(engine.batch_records) == iterations and in_flight and not engine.num_computing_elsewhere:
            upcoming = bisect.bisect_right(arrivals, before)
            if upcoming == len(arrivals):
                raise RuntimeError(f"engine stalled: {len(in_flight)} arrived requests, none runnable")
            time.sleep(max(0.0, arrivals[upcoming] - engine.clock()))
    return Replay(records, engine.batch_records[first_batch:])


@TARGETS.register("inprocess")
class InProcessTarget:
    """target=inprocess: an LLMEngine of the run's server-side config (this imports torch)."""

    client_nice = 0  # the load generator runs in the engine's thread: lowering it would lower the engine
    request_shape, engine_label = ENGINE_SHAPE, None

    def __init__(self, cfg: BenchConfig, log_dir: Path):
        from stallfree.engine import LLMEngine

        try:
            self.engine = LLMEngine.from_config(cfg.engine_sections())
        except ValueError as e:
            raise ConfigError(f"engine: {e}") from None
        kernels = f", linears {self.engine.linear_kernels}" if self.engine.linear_kernels else ""
        print(f"[target] {cfg.model.model} in this process: dtype {self.engine.dtype_choice}{kernels}", flush=True)
        self.vocab_size = model_vocab_size(cfg)
        # On a virtual clock the run's times do not depend on the CPU it gets: nothing to measure.
        self.engine_pid = None if cfg.virtual_time else os.getpid()
        self.pause_gc = cfg.virtual_time
        self.timeout_s = cfg.target.timeout_s
        self.max_concurrency = cfg.arrival.max_concurrency

    def replay(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        # One engine serves a sweep's runs, which replay the same prompts: no run starts on another's cache.
        self.engine.reset_prefix_cache()
        done = replay(self.engine, specs, warmup=warmup, timeout_s=self.timeout_s,
                      max_concurrency=self.max_concurrency, progress=progress, pause_gc=self.pause_gc)
        done.prefix_cache_reset = "reset"
        return done

    def finalize(self, run_dir: Path) -> None:
        pass

    def close(self) -> None:
        del self.engine
