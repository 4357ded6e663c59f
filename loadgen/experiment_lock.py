"""The lock of an experiment directory: jobs running in parallel (joblib workers, SLURM jobs on a shared
filesystem) write run directories and rebuild summary.parquet / capacity.json one at a time, so the last
rebuild sees every finished run and two jobs of the same point never replace each other's directory."""
from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".lock"


@contextmanager
def experiment_lock(exp_dir: Path) -> Iterator[None]:
    exp_dir.mkdir(parents=True, exist_ok=True)
    with open(exp_dir / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
