"""The one schema of a batch row: a BatchRecord (engine/outputs.py), one per engine iteration, whichever way
it came (the in-process engine's records as dicts, the server's ``GET /stallfree/batches`` JSON) and
wherever it goes (batches.parquet, analysis/load.py:load_batches).

``analysis`` must not import the engine, so the columns are spelled out here rather than read off the
dataclass; tests/loadgen/results/test_batch_rows.py checks them against BatchRecord's fields (names, order,
types). A field renamed in the dataclass fails that test, and every row checked here (the writer, the
poller, the reader) fails on a name the schema does not have, so no plot draws a column that is not there.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

_INT, _FLOAT, _FLOATS = pa.int64(), pa.float64(), pa.list_(pa.float64())
BATCH_SCHEMA = pa.schema([
    ("iteration", _INT), ("start_time", _FLOAT), ("end_time", _FLOAT),
    ("num_prefill_tokens", _INT), ("num_decode_tokens", _INT), ("num_prefill_seqs", _INT), ("num_decode_seqs", _INT),
    ("prefill_attention_work", _INT), ("decode_context_tokens", _INT), ("num_preemptions", _INT),
    ("num_kv_blocks_used", _INT), ("num_waiting", _INT), ("num_running", _INT),
    ("stage_busy_s", _FLOATS), ("stage_idle_s", _FLOATS), ("stage_handoff_s", _FLOATS), ("cpu_threads", _INT),
    ("prefix_cache_queried_tokens", _INT), ("num_cached_tokens", _INT), ("num_kv_blocks_evicted", _INT),
    ("num_kv_blocks_cached", _INT),
    ("model_flops", _FLOAT), ("bytes_moved", _FLOAT), ("mfu", _FLOAT), ("mbu", _FLOAT),
    ("linear_s", _FLOAT), ("attention_s", _FLOAT), ("other_s", _FLOAT),
])
BATCH_COLUMNS: tuple[str, ...] = tuple(BATCH_SCHEMA.names)
_COLUMN_SET = frozenset(BATCH_COLUMNS)


class BatchSchemaError(ValueError):
    """Batch rows whose columns are not BATCH_SCHEMA's."""


def _check_columns(columns: Iterable[str], source: str, *, allow_missing: bool) -> None:
    given = list(columns)
    unknown = [c for c in given if c not in BATCH_SCHEMA.names]
    missing = [] if allow_missing else [c for c in BATCH_COLUMNS if c not in given]
    if unknown or missing:
        parts = [f"unknown column(s) {', '.join(unknown)}"] if unknown else []
        parts += [f"missing column(s) {', '.join(missing)}"] if missing else []
        raise BatchSchemaError(f"{source}: {'; '.join(parts)} (a batch row has BatchRecord's fields: "
                               f"{', '.join(BATCH_COLUMNS)})")


def check_rows(rows: list[dict], source: str) -> list[dict]:
    """``rows`` unchanged if each has exactly BATCH_SCHEMA's columns; else BatchSchemaError naming ``source``
    and the columns that differ."""
    for row in rows:
        if row.keys() != _COLUMN_SET:
            _check_columns(row, source, allow_missing=False)
    return rows


def write_batches(rows: list[dict], path: Path) -> None:
    """batches.parquet from BatchRecord rows, typed by BATCH_SCHEMA."""
    pq.write_table(pa.Table.from_pylist(check_rows(rows, path.name), schema=BATCH_SCHEMA), path)


def read_batches(path: Path) -> pd.DataFrame:
    """batches.parquet as a frame with exactly BATCH_SCHEMA's columns, in its order: a column a run written
    before its field existed lacks is null; a column the schema does not have is a BatchSchemaError."""
    table = pq.read_table(path)
    _check_columns(table.column_names, str(path), allow_missing=True)
    columns = [table.column(name).cast(BATCH_SCHEMA.field(name).type) if name in table.column_names
               else pa.nulls(table.num_rows, BATCH_SCHEMA.field(name).type) for name in BATCH_COLUMNS]
    return pa.Table.from_arrays(columns, schema=BATCH_SCHEMA).to_pandas()
