"""Tell a stall of the whole machine from a load generator that falls behind.

The CI machine is a shared VM: now and then every process on it stops for a few hundred ms (CI once
saw a 490 ms gap in both the client and the fake server's subprocess at load average 0.7). A client
that sends on schedule cannot make up such a gap, so a timing-fidelity test retries an attempt that
coincided with one. A probe thread that only sleeps is what sees it: under the GIL it still wakes
within the 5 ms switch interval while the event loop is busy, so a slow client alone never trips it.
"""
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

STALL_S = 0.05
T = TypeVar("T")


@contextlib.contextmanager
def machine_stalls(tick_s: float = 0.001) -> Iterator[list[float]]:
    """Yield a list that fills with the length (s) of every probe wake-up later than STALL_S."""
    stalls: list[float] = []
    done = threading.Event()

    def probe() -> None:
        last = time.perf_counter()
        while not done.wait(tick_s):
            now = time.perf_counter()
            if now - last - tick_s > STALL_S:
                stalls.append(now - last)
            last = now

    thread = threading.Thread(target=probe, name="machine-stall-probe", daemon=True)
    thread.start()
    try:
        yield stalls
    finally:
        done.set()
        thread.join()


def retry_while_stalled(attempt: Callable[[], T], on_time: Callable[[T], bool], attempts: int = 3,
                        ) -> tuple[T, list[list[float]]]:
    """Run attempt() until on_time(result) or an attempt saw no machine stall; return the last result
    and the stalls seen under each attempt (for the failure message)."""
    history: list[list[float]] = []
    for _ in range(attempts):
        with machine_stalls() as stalls:
            result = attempt()
        history.append(stalls)
        if on_time(result) or not stalls:
            break
    return result, history
