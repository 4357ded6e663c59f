"""batches.parquet: one row per BatchRecord (stallfree.engine.records), typed by its schema, which is derived
from the dataclass's fields; analysis/load.py:load_batches reads it back."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stallfree.engine.records import BATCH_COLUMNS, BATCH_SCHEMA, BatchRecord, as_row
from stallfree.engine.records.batch_record import check_columns


def write_batches(records: list[BatchRecord], path: Path) -> None:
    """batches.parquet from BatchRecords, typed by BATCH_SCHEMA."""
    pq.write_table(pa.Table.from_pylist([as_row(r) for r in records], schema=BATCH_SCHEMA), path)


def read_batches(path: Path) -> pd.DataFrame:
    """batches.parquet as a frame with exactly BATCH_SCHEMA's columns, in its order: a column a run written
    before its field existed lacks is null; a column the schema does not have is a BatchSchemaError."""
    table = pq.read_table(path)
    check_columns(table.column_names, str(path), allow_missing=True)
    columns = [table.column(name).cast(BATCH_SCHEMA.field(name).type) if name in table.column_names
               else pa.nulls(table.num_rows, BATCH_SCHEMA.field(name).type) for name in BATCH_COLUMNS]
    return pa.Table.from_arrays(columns, schema=BATCH_SCHEMA).to_pandas()
