"""Running stallfree-bench as a user does: a subprocess in a scratch directory."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(sys.executable).parent / "stallfree-bench"


def bench(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})


def run_dirs(exp_dir: Path) -> list[Path]:
    return sorted(p for p in exp_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def kill_after_first_run(args: list[str], cwd: Path, exp_dir: Path, timeout: float) -> None:
    """Start a sweep and SIGKILL it (its whole process group: launcher workers too) once a run is written."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen([BENCH, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (exp_dir.is_dir() and run_dirs(exp_dir)) and time.monotonic() < deadline:
            assert proc.poll() is None, "the sweep ended before it was killed"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def url_run(url: str, results_dir: Path, *overrides: str) -> dict:
    """One run (in this process) of the tiny model's fixed workload on the running server at ``url``
    (target=url, an absolute SLO: no probe); its summary. Results go to results_dir/default/."""
    from hydra import compose, initialize_config_dir

    from stallfree.loadgen.config.checks import CONF_DIR
    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.sweep.live_target import LiveTarget
    from stallfree.loadgen.sweep.point import run_point

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", [
            "model=tiny", "workload=fixed", "target=url", f"target.url={url}", "slo.tbt_ms=1000",
            "min_engine_cpu_share=0", f"results_dir={results_dir}", *overrides]))
    targets = LiveTarget()
    try:
        return run_point(cfg, targets)
    finally:
        targets.close()
