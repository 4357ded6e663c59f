"""A results directory that cannot be written, whatever the reason (no permission, a file in the path, /proc,
a read-only or full filesystem), ends ``stallfree-bench`` and ``stallfree-report`` with one line and exit 2:
before any run when the directory is checked, or when a write fails mid-sweep, and then nothing
half-written counts as a complete run.

The filesystems are real where this process may mount a tmpfs (root); a refused permission is simulated at
the OS boundary, since root may write anywhere."""
from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records.run_summary import RunSummary
from stallfree.engine.records.writable import ResultsDirError
from stallfree.loadgen.config.checks import validate_cli
from stallfree.loadgen.results.run_dir import is_complete, write_run
from tests.helpers.paths import ROOT
from tests.loadgen.sweep.test_user_mistakes import BIN, RUN, assert_one_line, run

SIMULATED = ["model.runner=simulated", "model.clock=virtual", *RUN]


def _mount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True, capture_output=True)


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Path]:
    """A mount point for a tmpfs of the test's own options (``mount(options)``), unmounted afterwards."""
    where = tmp_path / "mnt"
    where.mkdir()
    mounted = []

    def mount(options: str) -> Path:
        try:
            _mount(where, options)
        except (OSError, subprocess.CalledProcessError):
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(where)
        return where

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def _fill(directory: Path) -> None:
    """Write into ``directory`` until its filesystem is full."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096))
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_bench_into_proc(tmp_path):
    """/proc is a directory root may 'write' to by its mode bits, but nothing can be created there: Hydra's
    own .hydra directory failed first, with a chained traceback."""
    done = run([BIN / "stallfree-bench", *SIMULATED, "results_dir=/proc/stallfree"], tmp_path)
    assert_one_line(done, 2, "stallfree-bench: config error", "results_dir", "/proc")


def test_bench_onto_a_read_only_filesystem(tmpfs, tmp_path):
    where = tmpfs("ro,size=1m")
    done = run([BIN / "stallfree-bench", *SIMULATED, f"results_dir={where / 'results'}"], tmp_path)
    assert_one_line(done, 2, "stallfree-bench: config error", "results_dir", "Read-only file system")


def test_bench_onto_a_full_disk(tmpfs, tmp_path):
    where = tmpfs("size=64k")
    _fill(where)
    done = run([BIN / "stallfree-bench", *SIMULATED, f"results_dir={where / 'results'}"], tmp_path)
    assert_one_line(done, 2, "stallfree-bench: config error", "results_dir", "No space left on device",
                    "free space")
    assert not (where / "results").exists()


@pytest.mark.slow
def test_the_disk_fills_up_while_a_run_is_written(tmpfs, tmp_path):
    """Room for the check and Hydra's directory, not for a whole run (a tmpfs of few inodes): the failed
    write ends the sweep with one line, and no run directory, complete or half-written, is left."""
    where = tmpfs("size=1m,nr_inodes=7")
    done = run([BIN / "stallfree-bench", "-m", *SIMULATED, "qps=1,2", f"results_dir={where}"], tmp_path)
    assert_one_line(done, 2, "stallfree-bench: results_dir error", "No space left on device")
    exp_dir = where / "default"
    assert (exp_dir / ".hydra").is_dir()  # it got past the check: the write of the run failed
    assert [p.name for p in exp_dir.iterdir() if p.name not in (".hydra", ".lock")] == []


def test_permission_refused(monkeypatch, tmp_path):
    """Root writes anywhere, so the refusal is the OS's answer, mocked: every check of a sweep says so."""
    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(ConfigError, match=r"^results_dir: cannot write in .*Permission denied"):
        validate_cli([*SIMULATED, f"results_dir={tmp_path / 'results'}"])


def test_a_write_that_fails_leaves_no_complete_run(monkeypatch, tmp_path):
    """summary.json, the mark of a complete run, fails to write (a full disk): nothing of the run stays."""
    real_write = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "summary.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(ResultsDirError, match="No space left on device.*free space"):
        write_run(tmp_path, "run", config={"qps": 1}, requests=[], summary=RunSummary.from_flat({"qps": 1}))
    assert not is_complete(tmp_path / "run") and list(tmp_path.iterdir()) == []


def test_report_into_an_unwritable_directory(tmp_path):
    example = ROOT / "results" / "example"
    done = run([BIN / "stallfree-report", str(example), "--export", "vllm", "--out", "/proc/stallfree"], tmp_path)
    assert_one_line(done, 2, "stallfree-report: error", "cannot write in /proc/stallfree")
