"""Client fidelity: the open-loop dispatcher (loadgen.openai_client.openloop) at 200 QPS with the project's HTTP client
(loadgen.openai_client.client, HTTP/1.1 on asyncio streams) and with an aiohttp client built as vLLM's ``bench serve``
builds its own (one ClientSession, a TCPConnector without a connection limit, the SSE stream read as it
arrives), against the fake SSE server of the tests.

The workload is that of tests/loadgen/openai_client/test_openloop.py:test_open_loop_at_200_qps (2000 Poisson requests at 200 QPS, 8 output tokens, fake server TTFT 20 ms / TBT 5 ms), run with the
dispatcher under SCHED_FIFO (as the test; where allowed) and again under the default scheduling policy
(as stallfree-bench runs it). Every trial is a fresh process; the clients alternate, trial by trial. Per
trial: schedule lag (actual - intended send) p50 / p99 / max, median TTFT / TBT, the token timestamp
error (client receive time - the fake's send time of each token) p50 / p99, the client process's CPU time
per request, and whether the fidelity bar holds (schedule lag p99 < 5 ms, achieved rate within 2%, median
TTFT and TBT within 2 ms of the fake's; the test asserts only the behaviour, with wide bounds).

    python -m benchmarks.client_fidelity [--repeats 5] [--out benchmarks/results/client_fidelity.json]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import aiohttp
import numpy as np

from stallfree.engine.records import RequestRecord
from stallfree.engine.records.request_metrics import summarize
from stallfree.loadgen.openai_client.client import HttpClient
from stallfree.loadgen.openai_client.completions import NO_DONE, ResponseError, apply_sse_event
from stallfree.loadgen.openai_client.openloop import run_open_loop
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.workload.request_specs import build_workload
from tests.helpers.fakes.fake_sse_server import realtime_priority, running_fake_server

TTFT_MS, TBT_MS, QPS, NUM_REQUESTS, OUTPUT_TOKENS = 20.0, 5.0, 200, 2000, 8


class AiohttpClient:
    """The trial client: loadgen.openai_client.client.HttpClient's interface on aiohttp, set up as vLLM's benchmark
    sets up its session (vllm/benchmarks/serve.py, lib/endpoint_request_func.py)."""

    def __init__(self, base_url: str, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AiohttpClient:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, headers=self._headers,
                                              timeout=aiohttp.ClientTimeout(total=None))
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()

    async def stream(self, path: str, body: bytes, record: RequestRecord) -> None:
        async with self._session.post(self.base_url + path, data=body) as response:
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")
                raise ResponseError(f"HTTP {response.status}: {text[:500]}")
            pending = b""
            async for piece in response.content.iter_any():
                received = time.time()
                *lines, pending = (pending + piece).split(b"\n")
                for line in lines:
                    if line.startswith(b"data:"):
                        apply_sse_event(line[5:].strip(), received, record)
        if record.status != "ok":
            raise ResponseError(NO_DONE)


CLIENTS = {"asyncio_streams": HttpClient, "aiohttp": AiohttpClient}
# the dispatcher under SCHED_FIFO (as the test; where allowed) or the default policy (as stallfree-bench)
PRIORITIES = {True: "sched_fifo", False: "normal"}


def passes_fidelity_test(s: dict) -> bool:
    """The fidelity bar on a run summary (the test's own bounds are wide: timing is measured here)."""
    return (s["completed"] == NUM_REQUESTS and abs(s["achieved_rate"] / s["offered_rate"] - 1) < 0.02
            and s["schedule_lag_p99_ms"] < 5 and abs(s["median_ttft_ms"] - TTFT_MS) < 2
            and abs(s["median_tbt_ms"] - TBT_MS) < 2)


def trial(client: str, url: str, realtime: bool) -> dict:
    """One 200-QPS run with ``client`` in this process; its figures."""
    specs = build_workload({"kind": "poisson", "qps": QPS}, {"kind": "fixed", "prompt": 16, "output": OUTPUT_TOKENS},
                           num_requests=NUM_REQUESTS, seed=0, vocab_size=1000)
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    with mock.patch("stallfree.loadgen.openai_client.openloop.HttpClient", CLIENTS[client]), \
            (realtime_priority() if realtime else contextlib.nullcontext()):
        rows = asyncio.run(run_open_loop(url, specs, model="fake", timeout_s=10))
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    s = summarize(requests_frame(rows))
    token_error_ms = np.concatenate([np.subtract(r.token_times, r.server_token_times) * 1e3
                                     for r in rows if r.status == "ok"])
    return {"client": client, "passes_fidelity_test": passes_fidelity_test(s),
            "completed": s["completed"], "failed": s["failed"],
            "achieved_over_offered": s["achieved_rate"] / s["offered_rate"],
            **{key: s[key] for key in ("schedule_lag_p50_ms", "schedule_lag_p99_ms", "schedule_lag_max_ms",
                                       "median_ttft_ms", "median_tbt_ms")},
            "token_timestamp_error_p50_ms": float(np.percentile(token_error_ms, 50)),
            "token_timestamp_error_p99_ms": float(np.percentile(token_error_ms, 99)),
            "client_cpu_ms_per_request": cpu_s * 1e3 / NUM_REQUESTS,
            "load_average_1min": os.getloadavg()[0]}


def run_trial_process(client: str, url: str, realtime: bool) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.client_fidelity", "--trial", client, "--url", url]
    if not realtime:
        cmd.append("--normal-priority")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    return json.loads(out.splitlines()[-1])


def medians(trials: list[dict]) -> dict:
    numeric = [k for k, v in trials[0].items() if isinstance(v, float | int) and not isinstance(v, bool)]
    return {"trials": len(trials), "passed": sum(t["passes_fidelity_test"] for t in trials),
            **{key: statistics.median(t[key] for t in trials) for key in numeric}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="trials per client and priority")
    ap.add_argument("--out", default="benchmarks/results/client_fidelity.json")
    ap.add_argument("--trial", choices=sorted(CLIENTS), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--normal-priority", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trial:
        print(json.dumps(trial(args.trial, args.url, realtime=not args.normal_priority)))
        return
    trials: list[dict] = []
    with running_fake_server(ttft_ms=TTFT_MS, tbt_ms=TBT_MS) as url:
        for i in range(args.repeats):
            for realtime in (True, False):
                for client in (sorted(CLIENTS) if i % 2 else sorted(CLIENTS, reverse=True)):
                    trials.append({"priority": PRIORITIES[realtime], **run_trial_process(client, url, realtime)})
                    print(json.dumps(trials[-1]), flush=True)
    result = {"qps": QPS, "num_requests": NUM_REQUESTS, "output_tokens": OUTPUT_TOKENS,
              "fake_ttft_ms": TTFT_MS, "fake_tbt_ms": TBT_MS, "cpus": os.cpu_count(),
              "aiohttp_version": aiohttp.__version__,
              "medians": {priority: {client: medians([t for t in trials
                                                      if t["client"] == client and t["priority"] == priority])
                                     for client in CLIENTS} for priority in PRIORITIES.values()},
              "trials": trials}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["medians"], indent=2))


if __name__ == "__main__":
    main()
