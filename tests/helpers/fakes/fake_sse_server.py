"""FAKE OpenAI completions server for tests only: no model, it streams max_tokens placeholder tokens
on a fixed schedule (first token ttft_ms after the request arrives, then one every tbt_ms) and adds
the stallfree timing extension to the final chunk, so tests know the true latencies.

A raw asyncio HTTP/1.1 server (keep-alive, chunked SSE), run as its own process so it does not
share a core or the GIL with the load generator under test:

    python tests/helpers/fakes/fake_sse_server.py --ttft-ms 20 --tbt-ms 5     # prints "PORT <n>", serves 127.0.0.1

``"model": "fake-status-<code>"`` in a request makes it answer with that HTTP error instead.
``GET /v1/models`` lists one model, ``FAKE_MODEL``.
``--max-concurrency N`` serves at most N requests at a time: the others queue (first come, first served)
and their schedule starts when they get a slot, so a load above N / (request time) makes it fall behind.
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


def _sse(obj: dict | str) -> bytes:
    data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"  # one HTTP chunk per SSE event


async def _stream_tokens(writer: asyncio.StreamWriter, request: dict, ttft_s: float, tbt_s: float,
                         slots: asyncio.Semaphore | None) -> None:
    arrival = time.time()
    async with slots or contextlib.nullcontext():
        await _stream_scheduled(writer, request, ttft_s, tbt_s, arrival)


async def _stream_scheduled(writer: asyncio.StreamWriter, request: dict, ttft_s: float, tbt_s: float,
                            arrival: float) -> None:
    loop = asyncio.get_running_loop()
    scheduled, start = time.time(), loop.time()
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
    timings = {"arrival_time": arrival, "first_scheduled_time": scheduled, "token_times": token_times,
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


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            ttft_s: float, tbt_s: float, slots: asyncio.Semaphore | None) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:  # keep-alive: one request after another on this connection
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.startswith("content-length:")), 0)
            request = json.loads(await reader.readexactly(length)) if length else {}
            model = request.get("model", "")
            if head.startswith("get /v1/models "):
                writer.write(_models_response())
            elif model.startswith(ERROR_MODEL_PREFIX):
                writer.write(_error_response(int(model.removeprefix(ERROR_MODEL_PREFIX))))
            else:
                await _stream_tokens(writer, request, ttft_s, tbt_s, slots)
            await writer.drain()
    writer.close()


async def _main(ttft_ms: float, tbt_ms: float, max_concurrency: int | None) -> None:
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, ttft_ms / 1e3, tbt_ms / 1e3, slots), "127.0.0.1", 0, backlog=1024)
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
def running_fake_server(ttft_ms: float = 20.0, tbt_ms: float = 5.0, max_concurrency: int | None = None) -> Iterator[str]:
    """Start the fake in a subprocess; yield its base URL; stop it on exit."""
    limit = ["--max-concurrency", str(max_concurrency)] if max_concurrency else []
    proc = subprocess.Popen([sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--tbt-ms", str(tbt_ms), *limit],
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
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests served at once (default: all)")
    args = parser.parse_args()
    with realtime_priority():
        asyncio.run(_main(args.ttft_ms, args.tbt_ms, args.max_concurrency))
