"""Whether results can be written where they go: a directory probed by writing a file in it, and the one
error (ResultsDirError) for every way it fails: no permission, a file in the path, /proc, a read-only or
full filesystem. No import of the rest of the project (stallfree-report uses it too)."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


class ResultsDirError(Exception):
    """Results cannot be written where they go; the message names the place, the OS's reason and what to do."""

    def __init__(self, where: Path, error: OSError, at: Path | None = None):
        at = at or error.filename or where  # the path the OS refused
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        super().__init__(f"cannot write in {where} ({at}: {error.strerror or error}); "
                         f"{'free space there or ' if full else ''}choose a directory you can write in")


def results_dir_error(error: OSError, root: str | Path) -> ResultsDirError | None:
    """``error`` as a ResultsDirError when it is about a path under ``root``, else None (a refused
    connection, a missing input file)."""
    root = Path(root).absolute()
    if error.filename is None or not Path(os.fsdecode(error.filename)).absolute().is_relative_to(root):
        return None
    return ResultsDirError(root, error)


def probe_writable(directory: str | Path) -> None:
    """Raise ResultsDirError unless ``directory`` can be created and written in: a small file is written in
    it (or in its closest existing parent) and removed again."""
    existing = Path(directory).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        with tempfile.TemporaryDirectory(prefix=".write-probe-", dir=existing) as probe:
            (Path(probe) / "probe").write_bytes(bytes(4096))
    except OSError as e:
        raise ResultsDirError(Path(directory), e, at=existing) from None  # not the probe's own name
