"""The engine thread: the only code that touches the (not thread-safe) LLMEngine, from its construction.

Submissions, aborts and calls (engine/server/commands.py) come in through a condition-guarded command list; outputs go back to each
submission's asyncio queue with ``loop.call_soon_threadsafe``. With nothing unfinished the thread
sleeps on the condition (no busy spin).

The engine is built on this thread, not on the one that serves HTTP: OpenMP keeps a worker team per
thread that ever ran a parallel region, and loading runs some. A second team's idle workers put the
process over one OpenMP thread per core, and libgomp then stops spin-waiting between parallel regions,
so each region pays a futex wake-up: a `small` decode step at batch 32 took 45-75 ms instead of 32-34
(docs/performance.md).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable

from stallfree.engine import LLMEngine, RequestOutput, SamplingParams
from stallfree.engine.server.commands import (
    Abort,
    EngineCall,
    EngineDead,
    EngineFailed,
    QueueFull,
    Submission,
)
from stallfree.engine.server.history import BatchHistory
from stallfree.engine.server.metrics import ServerMetrics

logger = logging.getLogger("stallfree.server")

# When requests are unfinished but an iteration scheduled nothing, wait this long before retrying.
STALL_WAIT_S = 0.005


class EngineLoop:
    """Starts the engine thread, which builds the engine with ``build_engine``; returns once it is built
    (re-raising what building raised), with ``engine`` set. The thread steps the engine once ``start``
    is called."""

    def __init__(self, build_engine: Callable[[], LLMEngine], max_waiting: int, history: BatchHistory):
        self.history = history  # the BatchRecords of GET /stallfree/batches
        self.max_waiting = max_waiting
        self.metrics: ServerMetrics | None = None  # set by start
        self.error: str | None = None  # why the thread died
        self.on_death: Callable[[], None] | None = None  # called on the engine thread if it dies (stallfree-serve exits)
        self._cond = threading.Condition()
        self._commands: list[Submission | Abort | EngineCall] = []
        self._stopping = False
        self._started = threading.Event()
        self._submissions = itertools.count()
        # engine-thread state
        self._routes: dict[str, tuple[Submission, int]] = {}
        self._progress = True
        self._build_error: BaseException | None = None
        built = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(build_engine, built), name="stallfree-engine",
                                        daemon=True)
        self._thread.start()
        built.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    # -- any thread --------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._started.is_set() and self._thread.is_alive() and not self._stopping

    def start(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self._started.set()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._started.set()  # a thread that was never started ends at once
        self._thread.join(timeout)

    async def submit(self, prompts: list[list[int]], params: list[SamplingParams], request_id: str,
                     arrival_time: float) -> Submission:
        """Queue the prompts as engine requests ``{request_id}-{i}-{n}``; returns once the engine thread
        added them all. ``n`` numbers the submissions, so that requests with the same (client-chosen)
        ``request_id`` in flight at once stay apart. Raises QueueFull, ValueError (rejected by the
        engine) or EngineDead."""
        n = next(self._submissions)
        sub = Submission([f"{request_id}-{i}-{n}" for i in range(len(prompts))], prompts, params, arrival_time,
                         asyncio.get_running_loop())
        self._post(sub)
        try:
            reply = await sub.queue.get()
        except asyncio.CancelledError:
            for rid in sub.request_ids:
                self.abort(rid)
            raise
        if isinstance(reply, BaseException):
            raise reply
        return sub

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._post(Abort(request_id, reason))

    async def call(self, fn: Callable[[LLMEngine], object]) -> object:
        """``fn(engine)``'s result, run on the engine thread between steps; raises what it raised, or EngineDead."""
        call = EngineCall(fn, asyncio.get_running_loop().create_future())
        self._post(call)
        return await call.future

    def _post(self, command: Submission | Abort | EngineCall) -> None:
        with self._cond:
            if not self.alive:
                if not isinstance(command, Abort):
                    raise EngineDead(self.error or "the engine is not running")
                return
            self._commands.append(command)
            self._cond.notify()

    # -- engine thread -----------------------------------------------------------------------------

    def _main(self, build_engine: Callable[[], LLMEngine], built: threading.Event) -> None:
        try:
            self.engine = build_engine()
        except BaseException as exc:
            self._build_error = exc
            return
        finally:
            built.set()
        self._started.wait()
        try:
            if not self._stopping:  # stopped before it was started: there is nothing to step or to fail
                self._run()
        finally:
            self.engine.shutdown()  # its worker processes, if any

    def _run(self) -> None:
        try:
            while (commands := self._wait_for_work()) is not None:
                for command in commands:
                    self._apply(command)
                if self.engine.has_unfinished():
                    self._step()
                self.engine.check_alive()  # a dead runner (a worker process died) ends the thread
                self.metrics.set_state(self.engine.num_running, self.engine.num_waiting, self.engine.kv_usage())
        except BaseException as exc:  # report any death: /health turns 503 and requests fail fast
            logger.exception("engine thread died")
            self.error = f"engine thread died: {type(exc).__name__}: {exc}"
            if self.on_death is not None:
                self.on_death()
        finally:
            with self._cond:
                self._stopping = True
                pending, self._commands = self._commands, []
            dead = EngineDead(self.error or "the server is shutting down")
            subs = {s for s in pending if isinstance(s, Submission)} | {s for s, _ in self._routes.values()}
            for sub in subs:
                self._deliver(sub, dead)
            for call in (c for c in pending if isinstance(c, EngineCall)):
                call.future.get_loop().call_soon_threadsafe(call.future.set_exception, dead)

    def _wait_for_work(self) -> list[Submission | Abort | EngineCall] | None:
        with self._cond:
            if not self._commands and not self._stopping:
                if not self.engine.has_unfinished():
                    self._cond.wait_for(lambda: self._commands or self._stopping)
                elif not self._progress:
                    self._cond.wait(STALL_WAIT_S)
            if self._stopping:
                return None
            commands, self._commands = self._commands, []
            return commands

    def _apply(self, command: Submission | Abort | EngineCall) -> None:
        if isinstance(command, EngineCall):
            try:
                settle, value = command.future.set_result, command.fn(self.engine)
            except Exception as exc:
                settle, value = command.future.set_exception, exc
            command.future.get_loop().call_soon_threadsafe(settle, value)
            return
        if isinstance(command, Abort):
            if self._routes.pop(command.request_id, None) and (aborted := self.engine.abort(command.request_id)):
                self.metrics.observe_finished(aborted, command.reason)
            return
        sub = command
        if self.engine.num_waiting + len(sub.request_ids) > self.max_waiting:
            self._deliver(sub, QueueFull(f"the waiting queue is full ({self.max_waiting} requests)"))
            return
        try:
            for index, (rid, prompt, params) in enumerate(zip(sub.request_ids, sub.prompts, sub.params,
                                                             strict=True)):
                self.engine.add_request(prompt, params, request_id=rid, arrival_time=sub.arrival_time)
                self._routes[rid] = (sub, index)
        except ValueError as exc:
            for rid in sub.request_ids:
                if self._routes.pop(rid, None):
                    self.engine.abort(rid)
            self._deliver(sub, exc)
            return
        self._deliver(sub, None)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            logger.exception("engine.step failed; failing the requests in the engine")
            self.metrics.engine_errors.inc()
            self._fail_all(EngineFailed(f"the engine failed: {type(exc).__name__}: {exc}"))
            return
        records = self.engine.pop_batch_records()
        self._progress = bool(records)
        for record in records:
            self.metrics.observe_iteration(record)
        self.history.extend(records)
        self.metrics.batch_history_records.set(len(self.history))
        batches: dict[Submission, list[tuple[int, RequestOutput]]] = {}
        failed: dict[Submission, EngineFailed] = {}
        for out in outputs:
            route = self._routes.pop(out.request_id) if out.finished else self._routes.get(out.request_id)
            if out.error is not None:  # the step failed on this request alone; the others carried on
                self.metrics.observe_finished(out, "error")
                if route is not None:
                    failed[route[0]] = EngineFailed(f"the engine failed on this request: {out.error}")
                continue
            self.metrics.observe_output(out)
            if route is not None:
                batches.setdefault(route[0], []).append((route[1], out))
        self._deliver_all([(sub, batch) for sub, batch in batches.items() if sub not in failed])
        for sub, error in failed.items():
            self._fail(sub, error)

    def _fail_all(self, error: Exception) -> None:
        for sub in {sub for sub, _ in self._routes.values()}:
            self._fail(sub, error)

    def _fail(self, sub: Submission, error: Exception) -> None:
        """End a submission with ``error``, aborting its other engine requests (other prompts)."""
        for rid in sub.request_ids:
            if self._routes.pop(rid, None):
                self.engine.abort(rid)
        self._deliver(sub, error)

    def _deliver(self, sub: Submission, item: object) -> None:
        self._deliver_all([(sub, item)])

    def _deliver_all(self, items: list[tuple[Submission, object]]) -> None:
        """One wake-up of each event loop for all of ``items``: each ``call_soon_threadsafe`` is a write to the
        loop's wake-up socket on this thread. At batch 32, handing over an iteration's tokens took the engine
        thread 1.14-1.17 ms with one per submission, 0.99-1.00 ms with one per loop; the rest is the woken
        event-loop thread preempting this one (docs/performance.md)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Submission, object]]] = {}
        for sub, item in items:
            by_loop.setdefault(sub.loop, []).append((sub, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # its event loop is closed: nobody is listening any more
                for sub, _ in batch:
                    for rid in sub.request_ids:
                        if self._routes.pop(rid, None):
                            self.engine.abort(rid)


def _put_all(items: list[tuple[Submission, object]]) -> None:
    for sub, item in items:
        sub.queue.put_nowait(item)
