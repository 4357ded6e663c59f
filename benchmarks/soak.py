"""Bounded soak test: a steady open-loop stream of completions against a stallfree-serve this script
starts, sampling the server's RSS (/proc/<pid>/status), its batch history size (the
``stallfree:batch_history_records`` gauge) and the error count; every ``--fetch-every`` seconds it
fetches the whole batch history while timing /health, to see whether the fetch stalls the event loop.
Halfway between two fetches it runs a control window: the same fetcher and /health probing for as long
as the last fetch took, but fetching /health. The stall a fetch adds to the streams is their token gaps
during fetches beyond their gaps during the control windows (the probing itself costs both CPU).

    python benchmarks/soak.py --rate 20 --duration 150 --warmup 30

Prints the RSS slope after warm-up and writes benchmarks/results/soak.json.
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from stallfree.loadgen.targets.server_process import ServerProcess, free_port

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
HISTORY_GAUGE = "stallfree:batch_history_records"


@dataclass
class Soak:
    rss_mib: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MiB)
    history_records: list[tuple[float, int]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, what)
    latencies_s: list[float] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)  # /health round trips outside history fetches
    health_during_fetch_s: list[float] = field(default_factory=list)
    fetch_s: list[float] = field(default_factory=list)
    fetch_windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end), seconds since t0
    control_windows: list[tuple[float, float]] = field(default_factory=list)  # the same, fetching /health
    token_gaps: list[tuple[float, float]] = field(default_factory=list)  # (end of the gap since t0, seconds)

    def count(self, status: str, t: float, detail: str = "") -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "200":
            self.errors.append((t, f"{status} {detail}".strip()))


def start_server(model: str, extra: list[str], log: Path) -> ServerProcess:
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("stallfree-serve")), f"model={model}", f"port={port}",
           "log_level=error", *extra]
    return ServerProcess(cmd, f"http://127.0.0.1:{port}", log).start()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def gauge(metrics_text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith(name))


async def one_request(client: httpx.AsyncClient, body: dict, soak: Soak, t0: float) -> None:
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            lines, last = [], None
            async for line in r.aiter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    now = time.monotonic() - t0
                    if last is not None:
                        soak.token_gaps.append((now, now - last))
                    last = now
            text = "\n".join(lines)
        ok = r.status_code == 200 and text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        status = str(r.status_code) if ok or r.status_code != 200 else "200-broken-stream"
        soak.count(status, time.monotonic() - t0, "" if ok else text[-300:])
        soak.latencies_s.append(time.perf_counter() - start)
    except httpx.HTTPError as exc:
        soak.count(type(exc).__name__, time.monotonic() - t0, repr(exc))


async def timed_get(client: httpx.AsyncClient, path: str) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = await client.get(path)
    return response, time.perf_counter() - start


async def sample(client: httpx.AsyncClient, pid: int, t0: float, soak: Soak) -> None:
    metrics, _ = await timed_get(client, "/metrics")
    now = time.monotonic() - t0
    soak.rss_mib.append((now, rss_mib(pid)))
    soak.history_records.append((now, int(gauge(metrics.text, HISTORY_GAUGE))))
    _, health = await timed_get(client, "/health")
    soak.health_s.append(health)


# The fetch runs in a process of its own, started once: read in this one, a 10 MB response would stall
# this event loop, and the /health probes would time the client instead of the server; a new Python
# process per fetch spent ~300 ms of a core starting up, inside the window the token gaps are compared in.
FETCHER_SCRIPT = ("import sys, time, urllib.request\n"
                  "for url in sys.stdin:\n"
                  "    t = time.perf_counter(); urllib.request.urlopen(url.strip(), timeout=120).read()\n"
                  "    print(time.perf_counter() - t, flush=True)\n")


async def probe_window(client: httpx.AsyncClient, fetcher: asyncio.subprocess.Process, soak: Soak, t0: float,
                       control: bool) -> None:
    """A history fetch (control: a /health fetch lasting as long as the last history fetch) by the
    fetcher process, with /health timed back to back meanwhile."""
    started = time.monotonic() - t0
    path = "/health" if control else "/stallfree/batches?since=0"
    fetcher.stdin.write(f"{str(client.base_url).rstrip('/')}{path}\n".encode())
    done = asyncio.ensure_future(fetcher.stdout.readline())
    min_end = started + (soak.fetch_s[-1] if control else 0.0)
    while not done.done() or time.monotonic() - t0 < min_end:
        _, health = await timed_get(client, "/health")
        (soak.health_s if control else soak.health_during_fetch_s).append(health)
    fetch_s = float(await done or "nan")
    if not control:
        soak.fetch_s.append(fetch_s)
    (soak.control_windows if control else soak.fetch_windows).append((started, time.monotonic() - t0))


async def soak_run(url: str, pid: int, args: argparse.Namespace) -> Soak:
    soak, rng = Soak(), random.Random(0)
    # Idle connections are dropped before the server's keep-alive timeout (5 s), so that a request is
    # never sent on a connection the server is closing.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0)
    fetcher = await asyncio.create_subprocess_exec(sys.executable, "-c", FETCHER_SCRIPT, stdin=asyncio.subprocess.PIPE,
                                                   stdout=asyncio.subprocess.PIPE)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, trust_env=False) as client, \
            httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as probe:
        t0 = time.monotonic()
        requests: set[asyncio.Task] = set()
        next_sample = next_fetch = 0.0
        next_control = math.inf
        for i in range(int(args.rate * args.duration)):
            due = i / args.rate
            while (now := time.monotonic() - t0) < due:
                if now >= next_sample:
                    await sample(probe, pid, t0, soak)
                    next_sample += args.sample_every
                elif now >= next_fetch and now >= args.warmup:
                    await probe_window(probe, fetcher, soak, t0, control=False)
                    next_fetch, next_control = now + args.fetch_every, now + args.fetch_every / 2
                elif now >= next_control:
                    await probe_window(probe, fetcher, soak, t0, control=True)
                    next_control = math.inf
                else:
                    await asyncio.sleep(min(due - now, 0.01))
            body = {"prompt": [rng.randrange(3, 2000) for _ in range(args.prompt_tokens)],
                    "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True}
            task = asyncio.create_task(one_request(client, body, soak, t0))
            requests.add(task)
            task.add_done_callback(requests.discard)
        await asyncio.gather(*requests)
        await sample(probe, pid, t0, soak)
    fetcher.stdin.close()
    await fetcher.wait()
    return soak


def slope_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    times, values = zip(*points, strict=True)
    return statistics.linear_regression(times, values).slope * 60


def overlaps(windows: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether [start, end] overlaps one of ``windows`` (sorted, disjoint)."""
    last = bisect.bisect_left(windows, (end,)) - 1  # the last window that started before ``end``
    return last >= 0 and windows[last][1] > start


def gap_split(soak: Soak, warmup: float) -> dict[str, list[float]]:
    """Token gaps after warm-up: those that overlap a history fetch, a control window, or neither."""
    split: dict[str, list[float]] = {"during_fetch": [], "during_control": [], "outside_fetch": []}
    for end, gap in soak.token_gaps:
        if end - gap < warmup:
            continue
        where = ("during_fetch" if overlaps(soak.fetch_windows, end - gap, end) else
                 "during_control" if overlaps(soak.control_windows, end - gap, end) else "outside_fetch")
        split[where].append(gap)
    return split


QUANTILES = (("p50", 0.5), ("p99", 0.99), ("max", 1.0))


def gap_ms(gaps: list[float], q: float) -> float:
    return 1000 * (sorted(gaps)[min(len(gaps) - 1, int(q * len(gaps)))] if gaps else 0.0)


def summary(soak: Soak, args: argparse.Namespace) -> dict:
    steady = [(t, v) for t, v in soak.rss_mib if t >= args.warmup]
    latencies = sorted(soak.latencies_s) or [0.0]
    errors = sum(n for status, n in soak.statuses.items() if status != "200")
    gaps = gap_split(soak, args.warmup)
    return {
        "config": vars(args),
        "requests": sum(soak.statuses.values()), "errors": errors, "statuses": soak.statuses,
        "latency_p50_s": latencies[len(latencies) // 2], "latency_p99_s": latencies[int(len(latencies) * 0.99)],
        "rss_mib_after_warmup": [steady[0][1], steady[-1][1]] if steady else None,
        "rss_slope_mib_per_min": slope_per_min(steady),
        "batch_history_records_max": max((n for _, n in soak.history_records), default=0),
        "health_p50_ms": 1000 * statistics.median(soak.health_s or [0.0]),
        "health_max_ms": 1000 * max(soak.health_s, default=0.0),
        "health_max_ms_during_history_fetch": 1000 * max(soak.health_during_fetch_s, default=0.0),
        "history_fetch_s": soak.fetch_s,
        **{f"token_gap_{name}_ms_{where}": gap_ms(gaps, q) for where, gaps in gaps.items()
           for name, q in QUANTILES},
        # The stall a fetch adds to a stream: its token gaps beyond those of the control windows.
        **{f"fetch_stall_{name}_ms": gap_ms(gaps["during_fetch"], q) - gap_ms(gaps["during_control"], q)
           for name, q in QUANTILES},
        "samples": asdict(soak) | {"latencies_s": None, "token_gaps": None},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (open loop)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds left out of the RSS slope")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS / history samples")
    parser.add_argument("--fetch-every", type=float, default=15.0, help="seconds between full history fetches")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="extra stallfree-serve overrides (key=value)")
    args = parser.parse_args()
    with start_server(args.model, args.overrides, args.out.with_suffix(".server.log")) as server:
        soak = asyncio.run(soak_run(server.url, server.pid, args))
    result = summary(soak, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result | {"config": {**vars(args), "out": str(args.out)}}, indent=1))
    print(f"{result['requests']} requests, {result['errors']} errors {soak.statuses}; "
          f"p50 {result['latency_p50_s']:.3f} s, p99 {result['latency_p99_s']:.3f} s")
    print(f"RSS after warm-up {result['rss_mib_after_warmup']} MiB, slope {result['rss_slope_mib_per_min']:+.2f} "
          f"MiB/min; batch history max {result['batch_history_records_max']} records")
    print("token gaps p50 / p99 / max: " + "; ".join(
        f"{where.replace('_', ' ')} " + " / ".join(f"{result[f'token_gap_{name}_ms_{where}']:.1f}" for name, _ in QUANTILES)
        for where in ("during_fetch", "during_control", "outside_fetch")) + " ms")
    print("stall a fetch adds (during fetch - during control) p50 / p99 / max: "
          + " / ".join(f"{result[f'fetch_stall_{name}_ms']:+.1f}" for name, _ in QUANTILES) + " ms")
    print(f"/health max {result['health_max_ms']:.1f} ms, during history fetches "
          f"{result['health_max_ms_during_history_fetch']:.1f} ms (fetches: "
          f"{', '.join(f'{s:.2f}' for s in soak.fetch_s)} s)")


if __name__ == "__main__":
    main()
