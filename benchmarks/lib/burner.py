"""A CPU burner: a process keeping a fraction of one core busy, for measurements under contention."""
from __future__ import annotations

import subprocess
import sys
import time

SPIN = """import sys, time
duty = float(sys.argv[1])
while True:
    end = time.perf_counter() + 0.01 * duty
    while time.perf_counter() < end:
        pass
    if duty < 1:
        time.sleep(0.01 * (1 - duty))
"""


class Burner:
    """``with Burner(duty): ...`` keeps ``duty`` (0..1) of one core busy meanwhile (0: none)."""

    def __init__(self, duty: float):
        self.duty, self.proc = duty, None

    def __enter__(self) -> Burner:
        if self.duty > 0:
            self.proc = subprocess.Popen([sys.executable, "-c", SPIN, str(self.duty)])
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()
