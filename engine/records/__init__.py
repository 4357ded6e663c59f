"""The records floor: what a run produces, typed once for engine, loadgen and analysis alike.

Plain dataclasses and the Arrow schemas derived from them; nothing here imports torch, Hydra or another part
of stallfree (an import-linter contract in pyproject.toml), so analysis may stand on it without the engine.
"""
from stallfree.engine.records.arrow_schema import arrow_schema, as_row
from stallfree.engine.records.batch_record import (
    BATCH_COLUMNS,
    BATCH_SCHEMA,
    BatchRecord,
    BatchSchemaError,
    decode_batch,
    encode_batch,
)
from stallfree.engine.records.request_record import NOT_SENT, RequestRecord, session_ended
from stallfree.engine.records.request_spec import RequestSpec, session_groups

__all__ = ["BATCH_COLUMNS", "BATCH_SCHEMA", "NOT_SENT", "BatchRecord", "BatchSchemaError", "RequestRecord",
           "RequestSpec", "arrow_schema", "as_row", "decode_batch", "encode_batch", "session_ended", "session_groups"]
