"""One process's part of a Locust test (loadgen/locust/locustfile.py): its requests grouped by session, the
schedule's clock, the requests in flight and the rows file. Imported only inside a Locust process (Locust
monkeypatches with gevent on import).

A group is one request, or a multi-turn session's turns (loadgen.workload.sessions): a follow-up turn is sent
its think time after the turn before it ended, and a turn that fails ends its session, the turns after it rows
never sent that say why (as the bench's own dispatcher, loadgen.openai_client.openloop). Follow-up turns are
Locust requests of their own name (``<endpoint> follow-up``), so the request table shows them apart.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import gevent
from gevent import GreenletExit
from gevent.pool import Group
from locust.contrib.fasthttp import FastHttpSession
from locust.env import Environment
from locust.runners import WorkerRunner

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.engine.records.client_pace import MAX_SCHEDULE_LAG_P99_MS
from stallfree.loadgen.locust.llm_events import LiveEvents
from stallfree.loadgen.locust.schedule import process_groups
from stallfree.loadgen.locust.user_request import fire, report, stream_completion
from stallfree.loadgen.openai_client.completions import ResponseError

DONE_MESSAGE = "stallfree_done"  # a process -> the master (or itself): all of its requests have ended


class ProcessRun:
    """One process's part of a test (see the module docstring)."""

    def __init__(self, environment: Environment, live: LiveEvents):
        self.environment, self.opts, self.live = environment, environment.parsed_options, live
        runner = environment.runner
        self.index = runner.worker_index
        workers = self.opts.expect_workers if isinstance(runner, WorkerRunner) else 1
        self.groups, self.remaining = process_groups(self.opts, self.index, workers)
        self.start_wall = self.start_mono = None  # the schedule's zero: the first dispatcher's start
        self.open_groups = Group()  # the open loop's requests and sessions, each in its own greenlet
        self.in_flight = 0  # requests sent and not ended: what --max-in-flight caps
        self.stopping = False
        self.rows_file = None
        if self.opts.rows_dir:
            role = "worker" if isinstance(runner, WorkerRunner) else "local"
            path = Path(self.opts.rows_dir) / f"rows-{role}{self.index}-{os.getpid()}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self.rows_file = path.open("a")

    def next_group(self) -> list[RequestSpec] | None:
        return None if self.stopping else next(self.groups, None)

    def start_clock(self) -> None:
        if self.start_mono is None:
            self.start_wall, self.start_mono = time.time(), time.monotonic()

    def dispatch(self, client: FastHttpSession, group: list[RequestSpec]) -> None:
        """Sleep until the group's send time, then run it in its own greenlet."""
        offset = group[0].send_offset_s
        gevent.sleep(max(0.0, self.start_mono + offset - time.monotonic()))
        self.open_groups.spawn(self.run_group, client, group, self.start_wall + offset, self.opts.max_in_flight)

    def run_group(self, client: FastHttpSession, group: list[RequestSpec], intended: float, cap: int = 0) -> None:
        """Send a request, or a session's turns one after another, the first due at ``intended``."""
        before = self.send(client, group[0], intended, cap)
        for k, spec in enumerate(group[1:], start=1):
            intended = (before.finish_time or time.time()) + spec.think_time_s
            if before.status != "ok":
                for rest in group[k:]:
                    self.record(RequestRecord.after_failed_turn(rest, before, intended_send_time=intended,
                                                                is_warmup=False))
                return
            gevent.sleep(max(0.0, intended - time.time()))
            before = self.send(client, spec, intended, cap)

    def send(self, client: FastHttpSession, spec: RequestSpec, intended: float, cap: int) -> RequestRecord:
        """Send one request now (or drop it: ``cap`` requests already in flight); return its record."""
        now = time.time()
        if (now - intended) * 1e3 > MAX_SCHEDULE_LAG_P99_MS:
            self.live.late_send(now)
        if cap and self.in_flight >= cap:
            record = RequestRecord.unsent(spec, intended_send_time=intended, is_warmup=False)
            record.error = f"dropped: {cap} requests in flight (--max-in-flight)"
            fire(self.environment, "dropped", 0.0, ResponseError(record.error))
            self.record(record)
            return record
        self.in_flight += 1
        try:
            result = stream_completion(client, spec, self.live, model=self.opts.model, intended_send_time=intended,
                                       timeout_s=self.opts.request_timeout, endpoint=self.opts.endpoint,
                                       ignore_eos=not self.opts.no_ignore_eos)
        finally:
            self.in_flight -= 1
        report(self.environment, self.opts.endpoint + (" follow-up" if spec.follows else ""), result)
        self.record(result.record)
        if result.killed:
            raise GreenletExit
        return result.record

    def record(self, record: RequestRecord) -> None:
        self.live.ended_request(record)
        if self.rows_file is not None:
            self.rows_file.write(json.dumps(dataclasses.asdict(record)) + "\n")
            self.rows_file.flush()
        if self.remaining is not None:
            self.remaining -= 1
            if self.remaining == 0:
                self.environment.runner.send_message(DONE_MESSAGE, self.index)

    def close(self) -> None:
        """Test stop: requests still in flight end as aborted records; the rows file is closed."""
        self.stopping = True
        self.open_groups.kill(block=True)
        if self.rows_file is not None:
            self.rows_file.close()
