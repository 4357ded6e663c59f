"""FAKE OpenAI completions server for tests only: no model, it streams max_tokens placeholder tokens
on a fixed schedule (first token ttft_ms after the request arrives, then one every tbt_ms) and adds
the stallfree timing extension to the final chunk, so tests know the true latencies.

A raw asyncio HTTP/1.1 server (keep-alive, chunked SSE), run as its own process so it does not
share a core or the GIL with the load generator under test:

    python tests/helpers/fakes/fake_sse_server.py --ttft-ms 20 --tbt-ms 5     # prints "PORT <n>", serves 127.0.0.1

``"model": "fake-status-<code>"`` in a request makes it answer with that HTTP error instead.

It describes itself as a server elsewhere does: ``GET /health`` answers 200, ``GET /version`` answers ``{"version": VERSION}``, ``GET /v1/models``
lists MODEL owned by OWNER, and every response carries a ``Server`` header. Behaviours of servers other than
stallfree's, for the harness's tests: ``--stop-after N`` ends every stream after at most N tokens (finish_reason
"stop"), as a server that ignores ``ignore_eos`` does; ``--reject-token-ids`` / ``--reject-ignore-eos`` answer a
token-id prompt / an ``ignore_eos`` field with an OpenAI-style HTTP 400; ``--die-after N`` exits the process
when completion request N + 1 arrives (every connection drops); ``--max-running N`` streams at most N requests
at a time, the others wait (first come, first served): a server that falls behind; ``--spike-share P
--spike-ms S`` makes a share P of the token gaps S ms longer (bimodal TBT, as hybrid steps make).

``GET /metrics`` serves vLLM-named series of its real state (``--metrics vllm``, the default: streams in
progress as running, requests held back by ``--max-running`` as waiting), or 404 (``--metrics none``), or a
page that is not Prometheus text (``--metrics garbage``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

ERROR_MODEL_PREFIX = "fake-status-"
# asyncio rounds epoll timeouts up to whole milliseconds, so a timer fires 0-1 ms late; aiming half a
# millisecond early centres the token times on their schedule.
TIMER_ROUNDING_S = 0.0005
METRICS_MODES = ("vllm", "none", "garbage")


@dataclass
class FakeBehaviour:
    """How the fake describes itself and which requests it refuses (see the module docstring)."""

    model: str = "fake-model"
    owned_by: str = "fake-engine"
    version: str = "1.2.3"
    server_header: str = "fake-engine/1.2.3"
    stop_after: int | None = None
    reject_token_ids: bool = False
    reject_ignore_eos: bool = False
    die_after: int | None = None
    max_running: int = 0  # 0: no cap
    metrics: str = "vllm"  # METRICS_MODES
    spike_share: float = 0.0  # of the token gaps, drawn from the prompt and the gap's index: spike_ms longer
    spike_ms: float = 0.0
    completions_seen: int = 0

    def args(self) -> list[str]:
        """The command-line flags that make a fake server behave so."""
        flags = ["--model", self.model, "--owned-by", self.owned_by, "--version", self.version,
                 "--server-header", self.server_header]
        flags += ["--stop-after", str(self.stop_after)] if self.stop_after is not None else []
        flags += ["--die-after", str(self.die_after)] if self.die_after is not None else []
        flags += ["--reject-token-ids"] * self.reject_token_ids + ["--reject-ignore-eos"] * self.reject_ignore_eos
        flags += ["--spike-share", str(self.spike_share), "--spike-ms", str(self.spike_ms)]
        return flags + ["--max-running", str(self.max_running), "--metrics", self.metrics]

    def spike_s(self, request: dict, gap: int) -> float:
        """The extra time of a request's token gap: ``spike_ms`` for a ``spike_share`` of them, which ones fixed by
        the prompt and the gap's index (a seeded workload gets the same gaps on every run), else 0."""
        key = f"{request.get('prompt') or request.get('messages')}|{gap}".encode()
        return self.spike_ms / 1e3 if zlib.crc32(key) % 100_000 < self.spike_share * 100_000 else 0.0

    def rejection(self, request: dict) -> str | None:
        """Why this request shape is refused (None: it is not)."""
        if self.reject_token_ids and isinstance(request.get("prompt"), list):
            return "prompt must be a string"
        if self.reject_ignore_eos and "ignore_eos" in request:
            return "Unrecognized request argument supplied: ignore_eos"
        return None


class FakeState:
    """What the fake's /metrics reports: its streams in progress and waiting, and counters."""

    def __init__(self, behaviour: FakeBehaviour):
        self.behaviour = behaviour
        self.slots = asyncio.Semaphore(behaviour.max_running) if behaviour.max_running else None
        self.running = self.waiting = self.prompt_tokens = 0

    def metrics_page(self) -> str:
        cap = self.behaviour.max_running
        usage = self.running / cap if cap else 0.0
        label = f'{{model_name="{self.behaviour.model}"}}'
        return "".join(f"# TYPE {name} {kind}\n{name}{suffix}{label} {value}\n" for name, kind, suffix, value in (
            ("vllm:num_requests_running", "gauge", "", self.running),
            ("vllm:num_requests_waiting", "gauge", "", self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "", usage),
            ("vllm:num_preemptions", "counter", "_total", 0),
            ("vllm:prefix_cache_queries", "counter", "_total", self.prompt_tokens),
            ("vllm:prefix_cache_hits", "counter", "_total", 0),
        ))

    @contextlib.asynccontextmanager
    async def slot(self, request: dict):
        """A running place for the request: counted waiting until ``--max-running`` lets it in."""
        self.waiting += 1
        try:
            if self.slots is not None:
                await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.prompt_tokens += _prompt_tokens(request.get("prompt") or "")
        try:
            yield
        finally:
            self.running -= 1
            if self.slots is not None:
                self.slots.release()


def _sse(obj: dict | str) -> bytes:
    data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"  # one HTTP chunk per SSE event


def _prompt_tokens(prompt: list | str) -> int:
    """A token-id prompt's length; a text prompt counts one token per word (the fake has no tokenizer)."""
    return len(prompt) if isinstance(prompt, list) else len(prompt.split())


async def _stream_tokens(writer: asyncio.StreamWriter, request: dict, ttft_s: float, tbt_s: float,
                         behaviour: FakeBehaviour, arrival: float) -> None:
    """Stream the request's tokens on schedule from now (it arrived at ``arrival``, then waited for a slot)."""
    loop = asyncio.get_running_loop()
    scheduled, start = time.time(), loop.time()
    requested = int(request.get("max_tokens", 16))
    n = requested if behaviour.stop_after is None else min(requested, behaviour.stop_after)
    finish_reason = "length" if n == requested else "stop"
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                 + f"server: {behaviour.server_header}\r\n\r\n".encode())
    token_times, due = [], start + ttft_s
    for i in range(n):
        if i:
            due += tbt_s + behaviour.spike_s(request, i)
        await asyncio.sleep(max(0.0, due - loop.time() - TIMER_ROUNDING_S))
        choice = {"index": 0, "text": " tok", "logprobs": None, "finish_reason": finish_reason if i == n - 1 else None}
        token_times.append(time.time())
        writer.write(_sse({"object": "text_completion", "model": request["model"], "choices": [choice]}))
        await writer.drain()  # raises once the client has gone
    prompt_tokens = _prompt_tokens(request.get("prompt") or " ".join(m["content"] for m in request["messages"]))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    timings = {"arrival_time": arrival, "first_scheduled_time": scheduled, "token_times": token_times,
               "finish_time": time.time(), "num_preemptions": 0}
    final = {"object": "text_completion", "choices": [], "usage": usage, "stallfree": timings}
    writer.write(_sse(final) + _sse("[DONE]") + b"0\r\n\r\n")


def _json_response(status: int, value: dict, server_header: str = "fake") -> bytes:
    body = json.dumps(value).encode()
    return (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Fake Error'}\r\ncontent-type: application/json\r\n"
            f"server: {server_header}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


def _error_response(status: int, message: str | None = None) -> bytes:
    error = {"message": message or f"fake error {status}", "type": "BadRequestError" if status == 400 else "fake",
             "param": None, "code": status}
    return _json_response(status, {"error": error})


def _describe(path: str, state: FakeState) -> bytes:
    """The answer to a GET: /version, /v1/models, /metrics, else 404."""
    behaviour = state.behaviour
    if path == "/metrics" and behaviour.metrics != "none":
        body, kind = (state.metrics_page(), "text/plain") if behaviour.metrics == "vllm" else ("<html>no</html>",
                                                                                               "text/html")
        data = body.encode()
        return f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data
    if path == "/version":
        return _json_response(200, {"version": behaviour.version}, behaviour.server_header)
    if path == "/health":
        return _json_response(200, {}, behaviour.server_header)
    if path == "/v1/models":
        models = [{"id": behaviour.model, "object": "model", "owned_by": behaviour.owned_by}]
        return _json_response(200, {"object": "list", "data": models}, behaviour.server_header)
    return _error_response(404)


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            ttft_s: float, tbt_s: float, state: FakeState) -> None:
    behaviour = state.behaviour
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:  # keep-alive: one request after another on this connection
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            method, path = (head.split(" ", 2) + ["", ""])[:2]
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.startswith("content-length:")), 0)
            request = json.loads(await reader.readexactly(length)) if length else {}
            model = request.get("model", "")
            if method == "get":
                writer.write(_describe(path, state))
            elif path == "/reset_prefix_cache":  # vLLM has it only with VLLM_SERVER_DEV_MODE=1
                writer.write(_error_response(404))
            elif model.startswith(ERROR_MODEL_PREFIX):
                writer.write(_error_response(int(model.removeprefix(ERROR_MODEL_PREFIX))))
            elif (reason := behaviour.rejection(request)) is not None:
                writer.write(_error_response(400, reason))
            else:
                behaviour.completions_seen += 1
                if behaviour.die_after is not None and behaviour.completions_seen > behaviour.die_after:
                    os._exit(1)  # a server that dies: every connection drops at once
                arrival = time.time()
                async with state.slot(request):
                    await _stream_tokens(writer, request, ttft_s, tbt_s, behaviour, arrival)
            await writer.drain()
    writer.close()


async def _main(ttft_ms: float, tbt_ms: float, behaviour: FakeBehaviour, port: int = 0) -> None:
    state = FakeState(behaviour)
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, ttft_ms / 1e3, tbt_ms / 1e3, state), "127.0.0.1", port,
        backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


@contextlib.contextmanager
def realtime_priority() -> Iterator[None]:
    """Run the calling thread under SCHED_FIFO where allowed (Linux, root); unchanged otherwise.

    On the shared 2-core machine, other CPU-bound processes delay even a bare asyncio timer loop
    (200 Hz): p99 lateness 1.3-9 ms, max 10-100 ms at load average 3-4, still ~4 / 11 ms at nice -10;
    under SCHED_FIFO 1.1 / 1.1 ms. Timing-fidelity tests measure the load generator, not that, so
    they and the fake server run real-time; both use a small fraction of a core.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, OSError):  # not Linux, or not permitted
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@contextlib.contextmanager
def running_fake_server(ttft_ms: float = 20.0, tbt_ms: float = 5.0, behaviour: FakeBehaviour | None = None,
                        **fields) -> Iterator[str]:
    """Start the fake in a subprocess; yield its base URL; stop it on exit. ``fields``: of a FakeBehaviour,
    when no ``behaviour`` is given (e.g. ``max_running=2``, ``metrics="none"``)."""
    behaviour = behaviour or FakeBehaviour(**fields)
    proc = subprocess.Popen([sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--tbt-ms", str(tbt_ms),
                             *behaviour.args()], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().split()[1])
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--tbt-ms", type=float, default=5.0)
    parser.add_argument("--model", default=FakeBehaviour.model)
    parser.add_argument("--owned-by", default=FakeBehaviour.owned_by)
    parser.add_argument("--version", default=FakeBehaviour.version)
    parser.add_argument("--server-header", default=FakeBehaviour.server_header)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--reject-token-ids", action="store_true")
    parser.add_argument("--reject-ignore-eos", action="store_true")
    parser.add_argument("--max-running", type=int, default=0, help="streams at once; more wait (0: no cap)")
    parser.add_argument("--metrics", choices=METRICS_MODES, default="vllm")
    parser.add_argument("--spike-share", type=float, default=0.0, help="of the token gaps, spike-ms longer")
    parser.add_argument("--spike-ms", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    fake = FakeBehaviour(args.model, args.owned_by, args.version, args.server_header, args.stop_after,
                         args.reject_token_ids, args.reject_ignore_eos, args.die_after, args.max_running,
                         args.metrics, args.spike_share, args.spike_ms)
    with realtime_priority():
        asyncio.run(_main(args.ttft_ms, args.tbt_ms, fake, args.port))
