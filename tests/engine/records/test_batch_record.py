"""BatchRecord's parquet schema and JSON form are derived from its fields: a field added to the dataclass is a
column and a JSON key with nothing else to edit, and a row of other names is an error naming them."""
import dataclasses
import json

import pyarrow as pa
import pytest

from stallfree.engine.records import (
    BATCH_COLUMNS,
    BATCH_SCHEMA,
    BatchRecord,
    BatchSchemaError,
    decode_batch,
    encode_batch,
)
from stallfree.engine.records.batch_record import check_columns
from tests.helpers.batch_records import example_batch_record


def test_the_schema_has_one_column_per_field_in_field_order_with_its_type():
    assert BATCH_COLUMNS == tuple(f.name for f in dataclasses.fields(BatchRecord))
    assert BATCH_SCHEMA.field("iteration").type == pa.int64()
    assert BATCH_SCHEMA.field("mfu").type == pa.float64()
    assert BATCH_SCHEMA.field("stage_busy_s").type == pa.list_(pa.float64())
    assert all(field.nullable for field in BATCH_SCHEMA)


def test_a_record_round_trips_through_its_json_form():
    record = example_batch_record(mfu=None, linear_s=0.01)
    assert decode_batch(json.loads(encode_batch(record)), "here") == record


def test_a_row_with_a_renamed_field_is_an_error_naming_both_names_and_the_source():
    row = json.loads(encode_batch(example_batch_record()))
    row["prefill_tokens"] = row.pop("num_prefill_tokens")
    with pytest.raises(BatchSchemaError, match="GET /stallfree/batches: unknown column.s. prefill_tokens; "
                                               "missing column.s. num_prefill_tokens"):
        decode_batch(row, "GET /stallfree/batches")


def test_a_subset_of_the_columns_passes_only_where_missing_ones_are_allowed():
    check_columns(BATCH_COLUMNS[:13], "old.parquet", allow_missing=True)
    with pytest.raises(BatchSchemaError, match="missing column.s. stage_busy_s"):
        check_columns(BATCH_COLUMNS[:13], "old.parquet", allow_missing=False)
