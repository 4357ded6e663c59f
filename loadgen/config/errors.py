"""How a command of the harness ends on an error: one line on stderr that says what to do, and a
documented exit code (docs/bench.md); the traceback only with ``STALLFREE_DEBUG=1``.

Exit codes: 2 a config error (the key is named) or results that cannot be written (engine.records.writable:
no permission, a read-only or full filesystem); 3 the target failed (unreachable, does not serve the
model, died or failed every request); 1 any other error; 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import one_line
from stallfree.engine.records.writable import ResultsDirError

EXIT_CONFIG, EXIT_TARGET, EXIT_OTHER, EXIT_INTERRUPTED = 2, 3, 1, 130


class TargetError(RuntimeError):
    """The run's target cannot serve it; the message says what to do."""


def debugging() -> bool:
    return os.environ.get("STALLFREE_DEBUG", "") not in ("", "0")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C as KeyboardInterrupt, except inside an object's finalizer (``__del__``, e.g. run by the garbage
    collector), where Python would print the exception and carry on with the job: there it comes again once
    the finalizer has returned. A bench interrupted while loading a tokenizer once kept running so."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            # to the main thread itself: a signal to the process may land on another thread, which leaves the
            # main thread's sleep or read uninterrupted until it returns on its own
            again = threading.Timer(0.01, signal.pthread_kill, (threading.main_thread().ident, signum))
            again.daemon = True
            again.start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def exit_on_error(prog: str, fn: Callable[[], object], interrupted: str = "interrupted") -> None:
    """Run ``fn``; an error or Ctrl-C ends the process with one line and its exit code."""
    replace = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, _interrupt) if replace else None
    try:
        fn()
    except ConfigError as e:
        print(f"{prog}: config error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except ResultsDirError as e:
        print(f"{prog}: results_dir error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:
        if debugging():
            raise
        code, what = (EXIT_TARGET, "target error") if isinstance(e, TargetError) else (EXIT_OTHER, "error")
        print(f"{prog}: {what}: {one_line(e)} (STALLFREE_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(code)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
