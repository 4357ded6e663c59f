"""How many threads the CPU engine runs with: the cores that other processes leave free.

Every parallel region of an OpenMP team waits for its slowest thread. When another process holds one of
the machine's cores, the thread that shares that core runs a fraction of the time and the whole team
waits for it, spinning: a 2-thread engine beside a one-core burner ran 3.3x slower than quiet, for half
the CPU (docs/performance.md, contention). A team that fits in the free cores loses only the missing
core's share. ``CpuThreads`` samples, at most every ``INTERVAL_S``, how busy the machine's CPUs were
without this process (``/proc/stat`` minus this process's own CPU time) and how long this process's
threads waited runnable for a CPU (``/proc/self/task/*/schedstat``). It shrinks torch's thread count
(which the native kernels follow too) to the cores left only when both say so: other processes hold a
core, and the team waits for it. A load generator streaming this server's tokens keeps a core busy in
bursts without making the team wait, and a team that kept both cores served it faster (docs/performance.md,
contention). A window in which this process mostly idled (a pause between requests) shows no run delay, but
nothing then competed with the others, so the CPU they used is what they ask for: after a short pause the
team shrinks on that alone, before its first iteration waits on the busy core; a long pause (another
server's burst that may be over) starts a fresh window instead. It grows the team back once the cores are
free again. On a quiet machine the team is every core, as before.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

INTERVAL_S = 0.2  # reading /proc/stat costs ~20 us; decisions faster than a prefill chunk buy nothing
MARGIN = 0.25  # a team of n threads needs n - MARGIN free cores (a 2-thread team beside a half-busy core wins)
HYSTERESIS = 0.3  # a thread comes back only once that many more cores are free, so the team does not flap
SMOOTHING = 0.5  # weight of a lower sample in the estimate of the other processes' load (a higher one counts at once)
DELAY_LIMIT = 0.25  # the team shrinks only if its threads waited runnable this share of the time (a burner: 0.45)
IDLE_LIMIT = 0.5  # below this many cores' worth of CPU in a window, the process was mostly idle in it
STALE_S = 2 * INTERVAL_S  # a pause longer than this says too little about the load now (it may have ended)


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # time.monotonic()
    busy_s: float  # CPU time of all processes (/proc/stat, every CPU, idle and iowait left out)
    own_s: float  # CPU time of this process (all its threads)
    waited_s: float  # time this process's threads waited runnable for a CPU (the kernel's run delay)


def read_sample() -> CpuSample:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, without idle and iowait
    own = os.times()
    waited_ns = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            waited_ns += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass  # a thread that just ended, or no schedstat
    return CpuSample(time.monotonic(), busy / ticks, own.user + own.system, waited_ns / 1e9)


def usable_cores() -> float:
    """The CPUs this process may run on, capped by the cgroup's CPU quota (containers)."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cores


_torch_threads = {"before": 0, "set_to": 0}  # torch's count before a governor first changed it, and the last one set


def set_torch_threads(threads: int) -> None:
    current = torch.get_num_threads()
    if current != _torch_threads["set_to"]:  # the count is the process's own, not a governor's
        _torch_threads["before"] = current
    _torch_threads["set_to"] = threads
    torch.set_num_threads(threads)


def quiet_threads() -> int:
    """torch's thread count as the process set it, before any governor shrank it: engines built one after
    another in a process (a profile, a benchmark) must not inherit a team shrunk for an earlier engine."""
    current = torch.get_num_threads()
    return _torch_threads["before"] if current == _torch_threads["set_to"] else current


class CpuThreads:
    """``max_threads``: the team size on a quiet machine (torch's default: the physical cores). ``sample``,
    ``set_threads`` and ``clock`` (the one ``sample`` reads ``wall_s`` from) are injected for tests."""

    def __init__(self, max_threads: int | None = None, *, cores: float | None = None,
                 sample: Callable[[], CpuSample] = read_sample,
                 set_threads: Callable[[int], None] = set_torch_threads,
                 clock: Callable[[], float] = time.monotonic):
        self.cores = usable_cores() if cores is None else cores
        self.max_threads = max(1, min(max_threads or quiet_threads(), math.floor(self.cores)))
        self.sample, self.set_threads, self.clock = sample, set_threads, clock
        self.others = 0.0  # cores' worth of CPU the other processes used lately
        self.threads = self.max_threads
        self.set_threads(self.threads)
        self.last = sample()

    def update(self) -> int:
        """Called before each iteration: the thread count it runs with."""
        if self.clock() - self.last.wall_s < INTERVAL_S:  # a sample reads a few /proc files: ~70 us
            return self.threads
        now = self.sample()
        wall = now.wall_s - self.last.wall_s
        ran, waited = now.own_s - self.last.own_s, now.waited_s - self.last.waited_s
        idle = ran < IDLE_LIMIT * wall
        if idle and wall > STALE_S:  # work after a long pause: start a fresh window
            self.last = now
            return self.threads
        others = max(0.0, (now.busy_s - self.last.busy_s) - ran) / wall
        delayed = waited / (ran + waited) if ran + waited > 0 else 0.0
        # Give up a core at once (a team waiting on a shared core loses most of the step), take one back
        # only once the load has stayed down (a burst elsewhere should not flip the team back and forth).
        self.others = others if others > self.others else self.others + SMOOTHING * (others - self.others)
        self.last = now
        fits = math.floor(self.cores - self.others + 1 - MARGIN)
        if fits < self.threads:
            # A window in which this process mostly idled (a short pause) shows no run delay, but nothing
            # then competed with the others: the CPU they used is what they ask for.
            threads = fits if delayed > DELAY_LIMIT or idle else self.threads
        else:
            threads = max(self.threads, math.floor(self.cores - self.others + 1 - MARGIN - HYSTERESIS))
        threads = max(1, min(self.max_threads, threads))
        if threads != self.threads:
            self.threads = threads
            self.set_threads(threads)
        return self.threads
