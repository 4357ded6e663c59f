"""batches.parquet (engine/records/batch_rows.py) holds BatchRecords by their derived schema, and reads back
files written before a field existed."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.engine.records import BATCH_COLUMNS, BatchSchemaError
from stallfree.engine.records.batch_rows import read_batches, write_batches
from tests.helpers.batch_records import example_batch_record


def test_a_record_round_trips_through_batches_parquet(tmp_path):
    records = [example_batch_record(), example_batch_record(iteration=4, mfu=None)]
    write_batches(records, tmp_path / "batches.parquet")
    frame = read_batches(tmp_path / "batches.parquet")
    assert list(frame.columns) == list(BATCH_COLUMNS)
    assert frame["iteration"].tolist() == [3, 4]
    assert list(frame["stage_idle_s"][0]) == [0.0, 0.1]
    assert frame["mfu"].isna().tolist() == [False, True]


def test_a_file_from_before_a_field_existed_reads_with_that_column_null(tmp_path):
    old = {name: [1] for name in BATCH_COLUMNS[:13]}  # the first fields, as the committed example results have
    pq.write_table(pa.table(old), tmp_path / "batches.parquet")
    frame = read_batches(tmp_path / "batches.parquet")
    assert list(frame.columns) == list(BATCH_COLUMNS)
    assert frame["mfu"].isna().all() and frame["num_running"].tolist() == [1]


def test_a_file_with_a_column_the_schema_lacks_is_an_error(tmp_path):
    pq.write_table(pa.table({"iteration": [0], "tokens": [5]}), tmp_path / "batches.parquet")
    with pytest.raises(BatchSchemaError, match="unknown column.s. tokens"):
        read_batches(tmp_path / "batches.parquet")
