import os
import subprocess
import time

from tests.helpers.machine_stalls import machine_stalls


def test_a_stopped_process_is_a_stall():
    with machine_stalls() as stalls:
        subprocess.run(["sh", "-c", f"kill -STOP {os.getpid()}; sleep 0.2; kill -CONT {os.getpid()}"], check=True)
        time.sleep(0.05)
    assert len(stalls) == 1 and 0.2 <= stalls[0] < 1.0, stalls


def test_a_busy_main_thread_is_not_a_stall():
    with machine_stalls() as stalls:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            sum(range(1000))
    assert stalls == []
