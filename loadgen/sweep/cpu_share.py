"""How much CPU the engine got during a run, against what it asked for, and what else ran (Linux /proc).

The engine asks for a CPU whenever one of its threads is runnable; the kernel's per-thread schedstat
(``/proc/<pid>/task/<tid>/schedstat``) counts the time each thread ran and the time it waited runnable
for a CPU (run delay). ``engine_cpu_share`` = ran / (ran + waited): an idle engine (waiting for
arrivals) asks for nothing, so a light load is not mistaken for a starved one. A run whose engine got
less than ``MIN_CPU_SHARE`` of what it asked for is ``disturbed``: another process (or a noisy
neighbour VM, see ``steal_share``) took its CPUs and its latencies measure the machine, not the policy.

Also recorded: the engine process's CPU time against wall x its threads, the load generator's CPU time
and share of all CPUs when it runs in a process of its own, the other processes' share (``/proc/stat``
minus the engine and the load generator), steal time and the 1-minute load average; and ``Placement``:
the CPUs and nice value the load generator and the engine ran with.

An engine elsewhere (target=url) cannot be watched; there the load generator (this process) is: its
threads' ``loadgen_sched_share`` (ran / (ran + waited)) below the same bound makes the run disturbed, a
client too starved to send and time on schedule (``compare_client``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from stallfree.engine.records.summary_parts import CpuReport, Placement

MIN_CPU_SHARE = 0.9
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuSample:
    wall_s: float
    thread_ns: dict[int, tuple[int, int]]  # tid -> (ran, waited runnable), ns
    engine_cpu_s: float  # user + system time of the engine process
    # this process's, and its children's that ended (Locust): the load generator's, when the engine runs elsewhere
    own_cpu_s: float
    cpu_ticks: list[int]  # /proc/stat "cpu": user nice system idle iowait irq softirq steal


def _process_cpu_s(pid: int, children: bool = False) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return (ticks + (int(fields[13]) + int(fields[14]) if children else 0)) * TICK_S  # cutime, cstime


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
    return CpuSample(time.time(), _threads(pid), _process_cpu_s(pid), _process_cpu_s(os.getpid(), children=True), ticks)


def _ran_and_waited(start: CpuSample, end: CpuSample) -> tuple[float, float]:
    """Seconds the sampled process's threads ran, and waited runnable for a CPU, between the samples."""
    ran = sum(r - start.thread_ns.get(tid, (0, 0))[0] for tid, (r, _) in end.thread_ns.items()) / 1e9
    waited = sum(w - start.thread_ns.get(tid, (0, 0))[1] for tid, (_, w) in end.thread_ns.items()) / 1e9
    return ran, waited


def _starved(share: float | None, min_share: float, who: str) -> str | None:
    """Why a run is disturbed when ``who`` got ``share`` of the CPU it asked for; None: it is not."""
    return f"{who} got {share:.0%} of the CPU it asked for" if share is not None and share < min_share else None


def _machine(start: CpuSample, end: CpuSample) -> tuple[float, float, float]:
    """All CPU time, idle CPU time, and the steal share between the samples (/proc/stat)."""
    ticks = [b - a for a, b in zip(start.cpu_ticks, end.cpu_ticks, strict=True)]
    total_s = max(sum(ticks), 1) * TICK_S
    return total_s, (ticks[3] + ticks[4]) * TICK_S, ticks[7] * TICK_S / total_s


def compare(start: CpuSample, end: CpuSample, same_process: bool, min_share: float = MIN_CPU_SHARE) -> CpuReport:
    """The report of the interval between two samples of one engine process. ``same_process``: the
    engine runs in this process (its CPU time is counted once among the others)."""
    ran, waited = _ran_and_waited(start, end)
    wall = end.wall_s - start.wall_s
    total_s, idle_s, steal = _machine(start, end)
    engine_s = end.engine_cpu_s - start.engine_cpu_s
    loadgen_s = None if same_process else end.own_cpu_s - start.own_cpu_s
    ours_s = engine_s + (loadgen_s or 0.0)
    share = ran / (ran + waited) if ran + waited > 0 else None
    threads = len(end.thread_ns)
    reason = _starved(share, min_share, "the engine")
    return CpuReport(
        engine_cpu_share=share, engine_cpu_s=engine_s, engine_run_delay_s=waited, engine_threads=threads,
        engine_cpu_per_thread_wall=engine_s / (wall * threads) if wall > 0 and threads else 0.0,
        loadgen_cpu_s=loadgen_s, loadgen_cpu_share=None if loadgen_s is None else loadgen_s / total_s,
        loadgen_sched_share=None, others_cpu_share=max(0.0, total_s - idle_s - ours_s) / total_s, steal_share=steal,
        load_avg_1m=os.getloadavg()[0], wall_s=wall, disturbed=reason is not None, disturbed_reason=reason)


def compare_client(start: CpuSample, end: CpuSample, min_share: float = MIN_CPU_SHARE) -> CpuReport:
    """The report of the interval between two samples of this process, the load generator of an engine
    elsewhere (target=url): the run is disturbed when the load generator got less than ``min_share`` of
    the CPU it asked for (its send times and token receive times are then late)."""
    ran, waited = _ran_and_waited(start, end)
    total_s, idle_s, steal = _machine(start, end)
    loadgen_s = end.own_cpu_s - start.own_cpu_s
    share = ran / (ran + waited) if ran + waited > 0 else None
    reason = _starved(share, min_share, "the load generator")
    return CpuReport(
        engine_cpu_share=None, engine_cpu_s=None, engine_run_delay_s=None, engine_threads=None,
        engine_cpu_per_thread_wall=None, loadgen_cpu_s=loadgen_s, loadgen_cpu_share=loadgen_s / total_s,
        loadgen_sched_share=share, others_cpu_share=max(0.0, total_s - idle_s - loadgen_s) / total_s,
        steal_share=steal, load_avg_1m=os.getloadavg()[0], wall_s=end.wall_s - start.wall_s,
        disturbed=reason is not None, disturbed_reason=reason)


def placement(in_process: bool, engine_pid: int | None, client_nice: int = 0) -> Placement:
    """The placement of a replay by this process on an engine in it (``in_process``) or at ``engine_pid``
    (None: external); ``client_nice``: what the target adds to this thread's nice value for its replay
    (capped at 19, as the kernel does)."""
    engine = os.getpid() if in_process else engine_pid
    engine_cpus = engine_nice = None
    if engine is not None:
        try:
            engine_cpus, engine_nice = sorted(os.sched_getaffinity(engine)), os.getpriority(os.PRIO_PROCESS, engine)
        except ProcessLookupError:  # the server died: its run fails on its requests, not here
            pass
    kind = "inprocess" if in_process else "external" if engine_pid is None else "subprocess"
    return Placement(kind, sorted(os.sched_getaffinity(0)), min(19, os.getpriority(os.PRIO_PROCESS, 0) + client_nice),
                     engine_cpus, engine_nice)


class CpuMonitor:
    """``with CpuMonitor(pid) as monitor: ...``, then ``monitor.report`` (None: no pid to watch, e.g. a
    remote server driven by another process, or no /proc). ``client_side``: there is no engine here to
    watch (pid None), this process is the load generator (target=url): watch it instead (compare_client)."""

    def __init__(self, pid: int | None, min_share: float = MIN_CPU_SHARE, client_side: bool = False):
        self.client_side = pid is None and client_side
        watched = os.getpid() if self.client_side else pid
        self.pid = watched if watched is not None and Path(f"/proc/{watched}/task").is_dir() else None
        self.min_share = min_share
        self.report: CpuReport | None = None

    def __enter__(self) -> CpuMonitor:
        self._start = sample(self.pid) if self.pid is not None else None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None or not Path(f"/proc/{self.pid}/task").is_dir():
            return
        end = sample(self.pid)
        self.report = (compare_client(self._start, end, self.min_share) if self.client_side
                       else compare(self._start, end, self.pid == os.getpid(), self.min_share))
