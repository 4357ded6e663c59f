"""The lock of an experiment directory: jobs running in parallel (joblib workers, SLURM jobs on a shared
filesystem) write run directories and rebuild summary.parquet / capacity.json one at a time, so the last
rebuild sees every finished run and two jobs of the same point never replace each other's directory.
An OS file lock (``filelock``), released when the holder ends, even when it is killed."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

LOCK_NAME = ".lock"


@contextmanager
def experiment_lock(exp_dir: Path) -> Iterator[None]:
    exp_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(exp_dir / LOCK_NAME):
        yield
