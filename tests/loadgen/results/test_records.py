"""RequestRecord is the one row type: requests.parquet's schema is derived from it and round-trips it."""
import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.engine.records.arrow_schema import arrow_type
from stallfree.engine.records.run_summary import RunSummary
from stallfree.loadgen.results.run_dir import REQUESTS_SCHEMA, write_run

EXPECTED_TYPES = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(),
                  list[float]: pa.list_(pa.float64())}


def a_record(**changes) -> RequestRecord:
    spec = RequestSpec("r0", 0.0, [11, 12, 13], max_tokens=4)
    record = RequestRecord.unsent(spec, intended_send_time=100.0, is_warmup=False)
    record.mark_sent(100.001)
    record.token_times = [100.1, 100.2]
    record.server_token_times = [100.09, 100.19]
    record.num_preemptions = 0
    record.end("ok", None, 100.25)
    return dataclasses.replace(record, **changes)


def test_schema_has_one_column_per_field_in_field_order():
    fields = dataclasses.fields(RequestRecord)
    assert REQUESTS_SCHEMA.names == [f.name for f in fields]
    assert all(field.nullable for field in REQUESTS_SCHEMA)
    assert REQUESTS_SCHEMA.field("token_times").type == pa.list_(pa.float64())
    assert REQUESTS_SCHEMA.field("server_token_times").type == pa.list_(pa.float64())
    assert REQUESTS_SCHEMA.field("is_warmup").type == pa.bool_()
    assert REQUESTS_SCHEMA.field("num_preemptions").type == pa.int64()


@pytest.mark.parametrize("annotation, arrow", [*EXPECTED_TYPES.items(), (float | None, pa.float64()),
                                                (list[float] | None, pa.list_(pa.float64()))])
def test_arrow_type_of_annotations(annotation, arrow):
    assert arrow_type(annotation) == arrow


def test_records_round_trip_through_requests_parquet(tmp_path):
    records = [a_record(), a_record(request_id="r1", status="timeout", error="slow", server_token_times=None,
                                    num_preemptions=None, is_warmup=True)]
    run_dir = write_run(tmp_path, "run", config={}, requests=records, summary=RunSummary.from_flat({}))
    table = pq.read_table(run_dir / "requests.parquet")
    assert table.schema == REQUESTS_SCHEMA
    assert [RequestRecord(**row) for row in table.to_pylist()] == records


def test_end_counts_tokens_and_sets_the_first_token_time():
    record = a_record()
    assert (record.status, record.error, record.finish_time) == ("ok", None, 100.25)
    assert (record.first_token_time, record.output_tokens) == (100.1, 2)
    usage_counted = a_record(output_tokens=7)  # the server's usage.completion_tokens of an ok stream
    usage_counted.end("ok", None, 101.0)
    assert usage_counted.output_tokens == 7
    usage_counted.end("timeout", "slow", 101.0)  # a failed request counts the tokens it received
    assert usage_counted.output_tokens == 2


def test_unsent_record():
    record = RequestRecord.unsent(RequestSpec("r9", 1.0, [1, 2], 3), intended_send_time=5.0, is_warmup=True)
    assert (record.status, record.error, record.send_time, record.token_times) == ("aborted", "not sent", None, [])
    assert (record.prompt_tokens, record.max_tokens, record.output_tokens) == (2, 3, 0)
