"""How much CPU the engine got during a run, against what it asked for, and what else ran (Linux /proc).

The engine asks for a CPU whenever one of its threads is runnable; the kernel's per-thread schedstat
(``/proc/<pid>/task/<tid>/schedstat``) counts the time each thread ran and the time it waited runnable
for a CPU (run delay). ``engine_cpu_share`` = ran / (ran + waited): an idle engine (waiting for
arrivals) asks for nothing, so a light load is not mistaken for a starved one. A run whose engine got
less than ``MIN_CPU_SHARE`` of what it asked for is ``disturbed``: another process (or a noisy
neighbour VM, see ``steal_share``) took its CPUs and its latencies measure the machine, not the policy.

Also recorded: the engine process's CPU time against wall x its threads, the other processes' share of
all CPUs (``/proc/stat`` minus the engine and this process), steal time and the 1-minute load average.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MIN_CPU_SHARE = 0.9
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuSample:
    wall_s: float
    thread_ns: dict[int, tuple[int, int]]  # tid -> (ran, waited runnable), ns
    engine_cpu_s: float  # user + system time of the engine process
    own_cpu_s: float  # this process's (the load generator's, when the engine runs elsewhere)
    cpu_ticks: list[int]  # /proc/stat "cpu": user nice system idle iowait irq softirq steal


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran, waited, _ = (task / "schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        threads[int(task.name)] = (int(ran), int(waited))
    return threads


def sample(pid: int) -> CpuSample:
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return CpuSample(time.time(), _threads(pid), _process_cpu_s(pid), _process_cpu_s(os.getpid()), ticks)


@dataclass
class CpuReport:
    engine_cpu_share: float | None  # ran / (ran + waited runnable), over the engine's threads
    engine_cpu_s: float
    engine_run_delay_s: float
    engine_threads: int
    engine_cpu_per_thread_wall: float  # engine CPU time / (wall x threads)
    others_cpu_share: float  # busy CPU time of other processes / all CPU time
    steal_share: float
    load_avg_1m: float
    wall_s: float
    disturbed: bool

    def as_summary(self) -> dict:
        return asdict(self)


def compare(start: CpuSample, end: CpuSample, same_process: bool, min_share: float = MIN_CPU_SHARE) -> CpuReport:
    """The report of the interval between two samples of one engine process. ``same_process``: the
    engine runs in this process (its CPU time is counted once among the others)."""
    ran = sum(r - start.thread_ns.get(tid, (0, 0))[0] for tid, (r, _) in end.thread_ns.items()) / 1e9
    waited = sum(w - start.thread_ns.get(tid, (0, 0))[1] for tid, (_, w) in end.thread_ns.items()) / 1e9
    wall = end.wall_s - start.wall_s
    ticks = [b - a for a, b in zip(start.cpu_ticks, end.cpu_ticks, strict=True)]
    total_s = max(sum(ticks), 1) * TICK_S
    idle_s = (ticks[3] + ticks[4]) * TICK_S
    engine_s = end.engine_cpu_s - start.engine_cpu_s
    ours_s = engine_s + (0.0 if same_process else end.own_cpu_s - start.own_cpu_s)
    share = ran / (ran + waited) if ran + waited > 0 else None
    threads = len(end.thread_ns)
    return CpuReport(
        engine_cpu_share=share, engine_cpu_s=engine_s, engine_run_delay_s=waited, engine_threads=threads,
        engine_cpu_per_thread_wall=engine_s / (wall * threads) if wall > 0 and threads else 0.0,
        others_cpu_share=max(0.0, total_s - idle_s - ours_s) / total_s, steal_share=ticks[7] * TICK_S / total_s,
        load_avg_1m=os.getloadavg()[0], wall_s=wall, disturbed=share is not None and share < min_share)


class CpuMonitor:
    """``with CpuMonitor(pid) as monitor: ...``, then ``monitor.report`` (None: no pid to watch, e.g. a
    remote server, or no /proc)."""

    def __init__(self, pid: int | None, min_share: float = MIN_CPU_SHARE):
        self.pid = pid if pid is not None and Path(f"/proc/{pid}/task").is_dir() else None
        self.min_share = min_share
        self.report: CpuReport | None = None

    def __enter__(self) -> CpuMonitor:
        self._start = sample(self.pid) if self.pid is not None else None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is not None and Path(f"/proc/{self.pid}/task").is_dir():
            self.report = compare(self._start, sample(self.pid), self.pid == os.getpid(), self.min_share)
