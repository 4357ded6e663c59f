"""FAKE OpenAI completions server for tests only: no model, it streams max_tokens placeholder tokens
on a fixed schedule (first token ttft_ms after the request arrives, then one every tbt_ms) and adds
the stallfree timing extension to the final chunk, so tests know the true latencies.

A raw asyncio HTTP/1.1 server (keep-alive, chunked SSE), run as its own process so it does not
share a core or the GIL with the load generator under test:

    python tests/helpers/fakes/fake_sse_server.py --ttft-ms 20 --tbt-ms 5     # prints "PORT <n>", serves 127.0.0.1

``"model": "fake-status-<code>"`` in a request makes it answer with that HTTP error instead.

``GET /v1/models`` lists one model, ``FAKE_MODEL``. ``GET /metrics`` serves vLLM-named series of its real
state (``--metrics vllm``, the default: streams in progress as running, requests held back by
``--max-running`` as waiting), or 404 (``--metrics none``), or a page that is not Prometheus text
(``--metrics garbage``).
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
from collections.abc import Iterator

ERROR_MODEL_PREFIX = "fake-status-"
FAKE_MODEL = "fake"
# asyncio rounds epoll timeouts up to whole milliseconds, so a timer fires 0-1 ms late; aiming half a
# millisecond early centres the token times on their schedule.
TIMER_ROUNDING_S = 0.0005
METRICS_MODES = ("vllm", "none", "garbage")


class FakeState:
    """What the fake's /metrics reports: its streams in progress and waiting, and counters."""

    def __init__(self, max_running: int):
        self.max_running = max_running  # 0: no cap
        self.slots = asyncio.Semaphore(max_running) if max_running else None
        self.running = self.waiting = self.prompt_tokens = 0

    def metrics_page(self) -> str:
        usage = self.running / self.max_running if self.max_running else 0.0
        label = f'{{model_name="{FAKE_MODEL}"}}'
        return "".join(f"# TYPE {name} {kind}\n{name}{suffix}{label} {value}\n" for name, kind, suffix, value in (
            ("vllm:num_requests_running", "gauge", "", self.running),
            ("vllm:num_requests_waiting", "gauge", "", self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "", usage),
            ("vllm:num_preemptions", "counter", "_total", 0),
            ("vllm:prefix_cache_queries", "counter", "_total", self.prompt_tokens),
            ("vllm:prefix_cache_hits", "counter", "_total", 0),
        ))


@contextlib.asynccontextmanager
async def _slot(state: FakeState, request: dict):
    """A running place for the request: counted waiting until ``--max-running`` lets it in."""
    state.waiting += 1
    try:
        if state.slots is not None:
            await state.slots.acquire()
    finally:
        state.waiting -= 1
    state.running += 1
    state.prompt_tokens += len(request.get("prompt", ""))
    try:
        yield
    finally:
        state.running -= 1
        if state.slots is not None:
            state.slots.release()


def _sse(obj: dict | str) -> bytes:
    data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"  # one HTTP chunk per SSE event


async def _stream_tokens(writer: asyncio.StreamWriter, request: dict, ttft_s: float, tbt_s: float) -> None:
    loop = asyncio.get_running_loop()
    arrival, start = time.time(), loop.time()
    n = int(request.get("max_tokens", 16))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    token_times = []
    for i in range(n):
        await asyncio.sleep(max(0.0, start + ttft_s + i * tbt_s - loop.time() - TIMER_ROUNDING_S))
        choice = {"index": 0, "text": " tok", "logprobs": None, "finish_reason": "length" if i == n - 1 else None}
        token_times.append(time.time())
        writer.write(_sse({"object": "text_completion", "model": request["model"], "choices": [choice]}))
        await writer.drain()  # raises once the client has gone
    usage = {"prompt_tokens": len(request["prompt"]), "completion_tokens": n,
             "total_tokens": len(request["prompt"]) + n}
    timings = {"arrival_time": arrival, "first_scheduled_time": arrival, "token_times": token_times,
               "finish_time": time.time(), "num_preemptions": 0}
    final = {"object": "text_completion", "choices": [], "usage": usage, "stallfree": timings}
    writer.write(_sse(final) + _sse("[DONE]") + b"0\r\n\r\n")


def _models_response() -> bytes:
    body = json.dumps({"object": "list", "data": [{"id": FAKE_MODEL, "object": "model"}]}).encode()
    return f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def _error_response(status: int) -> bytes:
    body = json.dumps({"error": {"message": f"fake error {status}", "type": "fake", "code": status}}).encode()
    return (f"HTTP/1.1 {status} Fake Error\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def _get_response(path: str, state: FakeState, metrics: str) -> bytes:
    if path == "/v1/models":
        return _models_response()
    if path != "/metrics" or metrics == "none":
        return _error_response(404)
    body, kind = (state.metrics_page(), "text/plain") if metrics == "vllm" else ("<html>no</html>", "text/html")
    data = body.encode()
    return f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            ttft_s: float, tbt_s: float, state: FakeState, metrics: str) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:  # keep-alive: one request after another on this connection
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.startswith("content-length:")), 0)
            request = json.loads(await reader.readexactly(length)) if length else {}
            model = request.get("model", "")
            method, path = head.split(" ", 2)[:2]
            if method == "get":
                writer.write(_get_response(path, state, metrics))
            elif model.startswith(ERROR_MODEL_PREFIX):
                writer.write(_error_response(int(model.removeprefix(ERROR_MODEL_PREFIX))))
            else:
                async with _slot(state, request):
                    await _stream_tokens(writer, request, ttft_s, tbt_s)
            await writer.drain()
    writer.close()


async def _main(ttft_ms: float, tbt_ms: float, metrics: str = "vllm", max_running: int = 0) -> None:
    state = FakeState(max_running)
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, ttft_ms / 1e3, tbt_ms / 1e3, state, metrics), "127.0.0.1", 0,
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
def running_fake_server(ttft_ms: float = 20.0, tbt_ms: float = 5.0, metrics: str = "vllm",
                        max_running: int = 0) -> Iterator[str]:
    """Start the fake in a subprocess; yield its base URL; stop it on exit."""
    proc = subprocess.Popen([sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--tbt-ms", str(tbt_ms),
                             "--metrics", metrics, "--max-running", str(max_running)],
                            stdout=subprocess.PIPE, text=True)
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
    parser.add_argument("--metrics", choices=METRICS_MODES, default="vllm")
    parser.add_argument("--max-running", type=int, default=0, help="streams at once; more wait (0: no cap)")
    args = parser.parse_args()
    with realtime_priority():
        asyncio.run(_main(args.ttft_ms, args.tbt_ms, args.metrics, args.max_running))
