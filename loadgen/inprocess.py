"""Replay a workload straight into an ``LLMEngine`` (no HTTP), open loop on the engine clock.

Every request is added up front with ``arrival_time = t0 + send_offset_s``; the policies only admit
requests that have arrived, so arrivals are gated on the engine clock. The loop steps the engine and,
when nothing was runnable and the next arrival is still ahead, sleeps until it. Rows follow the
requests.parquet schema of the HTTP client (docs/contracts.md): there is no network, so the
"client" times are the engine's own (send = arrival, token times = when each step ended).

The engine is passed in (this module never imports torch).
"""
from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence

from loadgen.client import new_row
from loadgen.workload import RequestSpec

START_DELAY_S = 0.01  # t0 a little ahead of now, so the first request is not late on arrival


def _finish_row(row: dict, metrics, status: str, error: str | None) -> None:
    times = list(metrics.token_times)
    row.update(status=status, error=error, output_tokens=len(times), token_times=times,
               first_token_time=metrics.first_token_time, finish_time=metrics.finish_time,
               server_arrival_time=metrics.arrival_time,
               server_first_scheduled_time=metrics.first_scheduled_time,
               server_finish_time=metrics.finish_time, server_token_times=times,
               num_preemptions=metrics.num_preemptions)


def replay(engine, specs: Sequence[RequestSpec], *, warmup: int = 0, timeout_s: float | None = None,
           progress: Callable[[dict], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Run ``specs`` through ``engine`` (greedy, ``ignore_eos``); return (rows in spec order, batches).

    * ``warmup``: the first ``warmup`` requests are marked ``is_warmup``.
    * ``timeout_s``: a request still unfinished this long after its arrival is aborted with status
      ``timeout``; a request the engine rejects becomes an ``error`` row.
    * ``progress(row)`` is called as each request finishes.
    * batches: ``engine.batch_records`` of this replay, as dicts.
    """
    from engine import SamplingParams

    first_batch = len(engine.batch_records)
    t0 = engine.clock() + START_DELAY_S
    rows = [new_row(spec, intended_send_time=t0 + spec.send_offset_s, is_warmup=i < warmup)
            for i, spec in enumerate(specs)]
    in_flight: dict[str, dict] = {}
    for spec, row in zip(specs, rows, strict=True):
        row["send_time"] = row["server_arrival_time"] = row["intended_send_time"]
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
        try:
            engine.add_request(spec.prompt_token_ids, params, request_id=spec.request_id,
                               arrival_time=row["intended_send_time"])
        except ValueError as e:
            row.update(status="error", error=f"rejected by the engine: {e}", finish_time=row["send_time"])
            if progress is not None:
                progress(row)
            continue
        in_flight[spec.request_id] = row
    arrivals = sorted(row["intended_send_time"] for row in in_flight.values())

    def done(request_id: str, metrics, status: str, error: str | None = None) -> None:
        row = in_flight.pop(request_id)
        _finish_row(row, metrics, status, error)
        if progress is not None:
            progress(row)

    while in_flight:
        before, iterations = engine.clock(), len(engine.batch_records)
        for out in engine.step():
            if out.finished:
                done(out.request_id, out.metrics, "ok")
        if timeout_s is not None:
            _abort_expired(engine, in_flight, engine.clock() - timeout_s, done)
        if len(engine.batch_records) == iterations and in_flight:
            upcoming = bisect.bisect_right(arrivals, before)
            if upcoming == len(arrivals):
                raise RuntimeError(f"engine stalled: {len(in_flight)} arrived requests, none runnable")
            time.sleep(max(0.0, arrivals[upcoming] - engine.clock()))
    return rows, [dataclasses.asdict(b) for b in engine.batch_records[first_batch:]]


def _abort_expired(engine, in_flight: dict[str, dict], deadline: float, done: Callable) -> None:
    """Abort the requests that arrived before ``deadline`` and are still unfinished."""
    for request_id in [rid for rid, row in in_flight.items() if row["intended_send_time"] < deadline]:
        metrics = engine.requests[request_id].metrics
        engine.abort(request_id)
        done(request_id, metrics, "timeout", "unfinished within timeout_s of its arrival")
