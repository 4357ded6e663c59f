"""Open-loop dispatcher: each request is sent at run start + its send_offset_s, as its own task, so
arrivals never wait for responses. The schedule is absolute: the dispatcher sleeps until each
request's own send time, so late wake-ups never accumulate.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from stallfree.engine.records import RequestRecord
from stallfree.engine.records.request_spec import RequestSpec, session_groups
from stallfree.loadgen.openai_client.client import HttpClient, send_request


async def run_open_loop(base_url: str, specs: Sequence[RequestSpec], *, model: str,
                        max_in_flight: int | None = None, timeout_s: float, warmup: int = 0,
                        duration_s: float | None = None, api_key: str | None = None,
                        endpoint: str = "completions", ignore_eos: bool = True,
                        progress: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Send ``specs`` open loop to an OpenAI-compatible server; return one record per spec, in order.

    * ``max_in_flight``: at most this many requests in flight (``arrival.max_concurrency``); a request due
      while the cap is reached is sent as soon as a slot frees, and its record keeps how long it waited
      (``client_wait_s``; the rest of its schedule lag is the dispatcher's own lateness).
    * ``endpoint``: ``completions`` (/v1/completions) or ``chat`` (/v1/chat/completions); ``ignore_eos``:
      whether each request carries it.
    * ``warmup``: the first ``warmup`` requests are marked ``is_warmup``.
    * ``duration_s``: only specs with ``send_offset_s < duration_s`` belong to the run; the others
      are dropped (no records).
    * A session's follow-up turn (``RequestSpec.follows``) is due ``think_time_s`` after the turn before it
      ended (its intended send time); a turn that fails ends its session: the turns after it are rows never
      sent, saying why.
    * ``progress(record)`` is called as each request finishes.
    * Cancellation (task cancel, Ctrl-C under ``run_open_loop_sync``) stops cleanly and returns the
      records: in-flight requests become ``aborted``, unsent ones ``aborted`` with error "not sent".
    """
    if duration_s is not None:
        specs = [spec for spec in specs if spec.send_offset_s < duration_s]
    gate = asyncio.Semaphore(max_in_flight) if max_in_flight else contextlib.nullcontext()
    loop = asyncio.get_running_loop()
    records: list[RequestRecord | None] = [None] * len(specs)
    tasks: list[asyncio.Task] = []

    async with HttpClient(base_url, api_key=api_key) as http:
        start_wall, start_loop = time.time(), loop.time()
        intended = [start_wall + spec.send_offset_s for spec in specs]  # a follow-up turn's is set as it comes due

        def unsent(i: int) -> RequestRecord:
            return RequestRecord.unsent(specs[i], intended_send_time=intended[i], is_warmup=i < warmup)

        async def dispatch(i: int) -> RequestRecord:
            held = bool(max_in_flight) and gate.locked()  # the cap was reached when it came due
            try:
                async with gate:
                    # held back: it waited from its scheduled send on, however late the dispatcher came to it
                    waited = time.time() - intended[i] if held else 0.0
                    record = await send_request(http, specs[i], model=model, timeout_s=timeout_s,
                                                intended_send_time=intended[i], is_warmup=i < warmup,
                                                endpoint=endpoint, ignore_eos=ignore_eos)
                    record.client_wait_s = waited if max_in_flight else None
            except asyncio.CancelledError:  # cancelled while waiting for a slot
                record = unsent(i)
            if progress is not None:
                progress(record)
            return record

        async def run_session(turns: list[int]) -> None:
            """A request, or a session's turns: each follow-up sent its think time after the one before ends."""
            for k, i in enumerate(turns):
                if k:
                    before = records[turns[k - 1]]
                    intended[i] = (before.finish_time or time.time()) + specs[i].think_time_s
                    if before.status != "ok":  # the session ends with its failed turn; the others go on
                        _end_session(records, turns[k:], specs, intended, warmup, before, progress)
                        return
                    try:
                        await asyncio.sleep(max(0.0, intended[i] - time.time()))
                    except asyncio.CancelledError:
                        return  # its turns left become unsent rows
                records[i] = await dispatch(i)

        try:
            for turns in session_groups(specs):
                await asyncio.sleep(max(0.0, start_loop + specs[turns[0]].send_offset_s - loop.time()))
                tasks.append(asyncio.create_task(run_session(turns)))
            if tasks:
                await asyncio.wait(tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)

    # a request never sent (its task cancelled before it ran, or its session's) has no record of its own
    return [record if record is not None else unsent(i) for i, record in enumerate(records)]


def _end_session(records: list, turns: list[int], specs: Sequence[RequestSpec], intended: list[float], warmup: int,
                 failed: RequestRecord, progress: Callable[[RequestRecord], None] | None) -> None:
    """The turns after a failed one: rows never sent, saying why."""
    for i in turns:
        records[i] = RequestRecord.after_failed_turn(specs[i], failed, intended_send_time=intended[turns[0]],
                                                     is_warmup=i < warmup)
        if progress is not None:
            progress(records[i])


def run_open_loop_sync(base_url: str, specs: Sequence[RequestSpec], *, nice: int = 0,
                       **kwargs) -> list[RequestRecord]:
    """``run_open_loop`` in a fresh event loop; Ctrl-C stops the run and still returns the records.

    ``nice`` > 0: the loop runs in a thread of its own whose nice value is that much higher than the
    caller's, so that an engine on the same CPUs gets them first. Linux keeps a nice value per thread
    (new threads and processes inherit their creator's), and an unprivileged process cannot lower it
    again: raising the caller's own would also lower every server it starts afterwards.
    """
    if nice <= 0:
        return asyncio.run(run_open_loop(base_url, specs, **kwargs))
    loop = asyncio.new_event_loop()
    task = loop.create_task(run_open_loop(base_url, specs, **kwargs))
    with ThreadPoolExecutor(1, thread_name_prefix="open-loop") as pool:
        records = pool.submit(_run_niced, loop, task, nice)
        try:
            return records.result()
        except KeyboardInterrupt:  # delivered to the main thread: stop the loop's run as asyncio.run would
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(task.cancel)
            try:
                return records.result()
            except asyncio.CancelledError:  # cancelled before it began: no records
                raise KeyboardInterrupt from None


def _run_niced(loop: asyncio.AbstractEventLoop, task: asyncio.Task, nice: int) -> list[RequestRecord]:
    os.nice(nice)  # this thread's alone (see run_open_loop_sync)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(task)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        asyncio.set_event_loop(None)
        loop.close()
