"""batches.parquet (loadgen/results/batch_rows.py) holds BatchRecords by their derived schema, and every place that
reads a batch column by name reads one the schema has."""
import ast
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.analysis.load import DERIVED_BATCH_COLUMNS, RUN_KEYS
from stallfree.engine.records import BATCH_COLUMNS, BatchSchemaError
from stallfree.loadgen.results.batch_rows import read_batches, write_batches
from tests.helpers.batch_records import example_batch_record

ROOT = Path(__file__).resolve().parents[3]


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


def _batch_columns_read_by_name(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each ``<...batch...>["name"]``: a column read off a batches frame or row."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str) and "batch" in ast.unparse(node.value)):
            found.append((node.lineno, node.slice.value))
    return found


def test_every_batch_column_read_by_name_is_in_the_schema():
    known = {*BATCH_COLUMNS, *DERIVED_BATCH_COLUMNS, *RUN_KEYS}
    files = [*sorted((ROOT / "analysis").glob("*.py")), ROOT / "loadgen/targets/batch_poller.py",
             ROOT / "loadgen/results/request_metrics.py"]
    reads = {f"{path.relative_to(ROOT)}:{line}": name for path in files
             for line, name in _batch_columns_read_by_name(path)}
    assert len(reads) > 20  # the walk finds the reads (analysis/plots.py, load.py, stalls.py, the poller)
    assert {where: name for where, name in reads.items() if name not in known} == {}
