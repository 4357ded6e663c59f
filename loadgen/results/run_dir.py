"""Run outputs: results/<experiment>/<run_id>/{config.yaml, requests.parquet, batches.parquet,
server_metrics.parquet, summary.json}, written into a temporary directory and renamed when complete, and
results/<experiment>/summary.parquet with one row per complete run.

requests.parquet has one row per RequestRecord; its schema is derived from the dataclass's fields.
server_metrics.parquet is long: one row per metric of each scrape of the server's /metrics
(loadgen.targets.server_metrics).

A directory that cannot be written (no permission, a read-only or full filesystem, a file in the path)
raises ResultsDirError, and nothing half-written is left to count as a complete run.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from stallfree.engine.records import BatchRecord, RequestRecord, arrow_schema, as_row
from stallfree.engine.records.batch_rows import write_batches
from stallfree.engine.records.run_summary import RunSummary, read_summary
from stallfree.engine.records.writable import ResultsDirError

MAX_RUN_ID_LEN = 180
REQUESTS_SCHEMA = arrow_schema(RequestRecord)
SERVER_METRICS_SCHEMA = pa.schema([("time", pa.float64()), ("metric", pa.string()), ("value", pa.float64()),
                                   ("series", pa.string())])


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _partial(path: Path, exp_dir: Path) -> Iterator[None]:
    """``path`` is being written: on any failure it is removed, and an OSError becomes a ResultsDirError."""
    try:
        yield
    except BaseException as e:
        _remove(path)
        if isinstance(e, OSError):
            raise ResultsDirError(exp_dir, e) from e
        raise


def make_run_id(params: dict) -> str:
    """``key=value`` pairs in the given order joined by commas, e.g. ``scheduler=sarathi,qps=1.0``.

    Characters outside ``[A-Za-z0-9._=,+-]`` become ``_``; ids longer than 180 characters are cut
    and end with a hash of the full id, so they stay unique and valid file names.
    """
    run_id = ",".join(f"{key}={value}" for key, value in params.items())
    run_id = re.sub(r"[^A-Za-z0-9._=,+-]", "_", run_id)
    if len(run_id) > MAX_RUN_ID_LEN:
        digest = hashlib.sha1(run_id.encode()).hexdigest()[:12]
        run_id = f"{run_id[:MAX_RUN_ID_LEN - 13]}-{digest}"
    return run_id


def requests_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """The records as a DataFrame with the requests.parquet columns (what engine.records.request_metrics reads)."""
    return pd.DataFrame([as_row(r) for r in records], columns=REQUESTS_SCHEMA.names)


def write_run(exp_dir: str | Path, run_id: str, *, config: dict | str, requests: Sequence[RequestRecord],
              summary: RunSummary, batches: list[BatchRecord] | None = None,
              server_metrics: list[dict] | None = None) -> Path:
    """Write one run into ``exp_dir/.<run_id>.tmp-<pid>`` and rename it to ``exp_dir/<run_id>``.

    ``config`` is a dict or already-rendered YAML; ``requests`` become requests.parquet, ``batches``
    (BatchRecords) batches.parquet and ``server_metrics`` (rows of SERVER_METRICS_SCHEMA, possibly none)
    server_metrics.parquet, each when given. An existing run directory of the same id is replaced.
    Returns the run directory.
    """
    exp_dir = Path(exp_dir)
    final, tmp = exp_dir / run_id, exp_dir / f".{run_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with _partial(tmp, exp_dir):
        tmp.mkdir(parents=True)
        text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        (tmp / "config.yaml").write_text(text)
        pq.write_table(pa.Table.from_pylist([as_row(r) for r in requests],
                                             schema=REQUESTS_SCHEMA), tmp / "requests.parquet")
        if batches is not None:
            write_batches(batches, tmp / "batches.parquet")
        if server_metrics is not None:
            pq.write_table(pa.Table.from_pylist(server_metrics, schema=SERVER_METRICS_SCHEMA),
                           tmp / "server_metrics.parquet")
        (tmp / "summary.json").write_text(summary.to_json())
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    return final


def is_complete(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


def rebuild_experiment_summary(exp_dir: str | Path) -> pd.DataFrame:
    """Collect summary.json of every complete run into ``exp_dir/summary.parquet`` (and return it).

    Nested values (dicts, lists) are stored as JSON strings so runs with different shapes still fit
    one table.
    """
    exp_dir = Path(exp_dir)
    rows = []
    for run_dir in sorted(p for p in exp_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if is_complete(run_dir):
            summary = read_summary(run_dir / "summary.json").flat()
            rows.append({key: json.dumps(value) if isinstance(value, dict | list) else value
                         for key, value in {**summary, "run_id": summary["run_id"] or run_dir.name}.items()})
    table = pd.DataFrame(rows)
    tmp = exp_dir / f".summary.parquet.tmp-{os.getpid()}"
    with _partial(tmp, exp_dir):
        table.to_parquet(tmp, index=False)
        tmp.replace(exp_dir / "summary.parquet")
    return table
