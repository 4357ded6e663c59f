"""How many threads the CPU engine runs with: the cores that other processes leave free.

Every parallel region of an OpenMP team waits for its slowest thread. When another process holds one of
the machine's cores, the thread that shares that core runs a fraction of the time and the whole team
waits for it, spinning: a 2-thread engine beside a one-core burner ran 3.3x slower than quiet, for half
the CPU (docs/performance.md, contention). A team that fits in the free cores loses only the missing
core's share. ``CpuThreads`` samples, at most every ``interval_s``, how busy the machine's CPUs were
without this process (``/proc/stat`` minus this process's own CPU time) and sets torch's thread count
(which the native kernels follow too) to the cores left. On a quiet machine that is every core, as
before.
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
MARGIN = 0.25  # cores another process must leave free before a thread is given back to the team
SMOOTHING = 0.5  # weight of the newest sample in the running estimate of the other processes' load


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # time.monotonic()
    busy_s: float  # CPU time of all processes (/proc/stat, every CPU, idle and iowait left out)
    own_s: float  # CPU time of this process (all its threads)


def read_sample() -> CpuSample:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, without idle and iowait
    own = os.times()
    return CpuSample(time.monotonic(), busy / ticks, own.user + own.system)


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


class CpuThreads:
    """``max_threads``: the team size on a quiet machine (torch's default: the physical cores). ``sample``
    and ``set_threads`` are injected for tests."""

    def __init__(self, max_threads: int | None = None, *, cores: float | None = None,
                 sample: Callable[[], CpuSample] = read_sample,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        self.cores = usable_cores() if cores is None else cores
        self.max_threads = max(1, min(max_threads or torch.get_num_threads(), math.floor(self.cores)))
        self.sample, self.set_threads = sample, set_threads
        self.others = 0.0  # cores' worth of CPU the other processes used lately
        self.threads = self.max_threads
        self.set_threads(self.threads)
        self.last = sample()

    def update(self) -> int:
        """Called before each iteration: the thread count it runs with."""
        now = self.sample()
        wall = now.wall_s - self.last.wall_s
        if wall < INTERVAL_S:
            return self.threads
        others = max(0.0, (now.busy_s - self.last.busy_s) - (now.own_s - self.last.own_s)) / wall
        self.others += SMOOTHING * (others - self.others)
        self.last = now
        threads = max(1, min(self.max_threads, math.floor(self.cores - self.others + 1 - MARGIN)))
        if threads != self.threads:
            self.threads = threads
            self.set_threads(threads)
        return self.threads
