"""BatchRecord: one engine iteration, as every target reports it and every reader takes it.

Its parquet schema (batches.parquet) and its JSON form (``GET /stallfree/batches``) are derived from the
dataclass's fields, so a field is added here and nowhere else: ``encode_batch`` and ``decode_batch`` are the
one JSON pair the server's batch history and the client's poller use, and a row whose names are not the
fields' is a BatchSchemaError naming its source and the names that differ.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from stallfree.engine.records.arrow_schema import arrow_schema


@dataclass
class BatchRecord:
    iteration: int  # 0, 1, ... in the order the engine ran them
    start_time: float  # on the engine's clock, when the step began scheduling
    end_time: float  # when the runner returned (forward pass and sampling done)
    num_prefill_tokens: int  # prompt tokens computed (all prefill chunks)
    num_decode_tokens: int  # decode tokens computed (one per decoding request)
    num_prefill_seqs: int  # requests with a prefill chunk in the iteration
    num_decode_seqs: int  # requests decoding in the iteration
    prefill_attention_work: int  # sum over prefill chunks of chunk tokens x (cached context + chunk tokens)
    decode_context_tokens: int  # sum over decodes of their context length
    num_preemptions: int  # requests preempted (by recompute) while building the iteration
    num_kv_blocks_used: int  # KV blocks held after the step (finished requests freed theirs)
    num_waiting: int  # requests waiting after the step
    num_running: int  # requests running after the step
    # A pipeline's stages, simulated (engine/simulator/pipeline.py) or real (engine/distributed/); else empty.
    stage_busy_s: list[float] = field(default_factory=list)  # each stage's busy time on this micro-batch
    stage_idle_s: list[float] = field(default_factory=list)  # each stage's idle time (bubble) right before it
    # the part of each stage's idle time spent taking the micro-batch once it was sent and the stage free
    stage_handoff_s: list[float] = field(default_factory=list)
    cpu_threads: int = 0  # CPU threads the iteration ran with (engine/runner/cpu_threads.py); 0: not on the CPU
    instance: str | None = None  # the instance of a disaggregated deployment that ran it (prefill-0, decode-0)
    # Prefix caching (engine/prefix_cache.py; all 0 without it), counted since the previous record:
    prefix_cache_queried_tokens: int = 0  # tokens of the requests admitted, looked up in the cache
    num_cached_tokens: int = 0  # of those, tokens taken from the cache (not computed)
    num_kv_blocks_evicted: int = 0  # cached blocks handed out for other tokens
    num_kv_blocks_cached: int = 0  # free blocks holding a cached prefix after the step (not in num_kv_blocks_used)
    # Utilisation (engine/utilization): counted from the shapes, against this machine's limits.
    model_flops: float = 0.0  # the iteration's model FLOPs (linear layers and attention)
    bytes_moved: float = 0.0  # weights read, KV read and written
    mfu: float | None = None  # model FLOPs / (time x peak FLOP/s); None when the limits are unknown
    mbu: float | None = None  # bytes moved / (time x memory bandwidth); None when the limits are unknown
    linear_s: float | None = None  # the operator split of a sampled iteration (model.op_split_every); else None
    attention_s: float | None = None
    other_s: float | None = None


BATCH_SCHEMA = arrow_schema(BatchRecord)
BATCH_COLUMNS: tuple[str, ...] = tuple(BATCH_SCHEMA.names)
_COLUMN_SET = frozenset(BATCH_COLUMNS)


class BatchSchemaError(ValueError):
    """Batch rows whose columns are not BatchRecord's fields."""


def check_columns(columns: Iterable[str], source: str, *, allow_missing: bool) -> None:
    """BatchSchemaError naming ``source`` unless ``columns`` are BatchRecord's fields (a subset where
    ``allow_missing``: a file written before a field existed)."""
    given = list(columns)
    unknown = [c for c in given if c not in _COLUMN_SET]
    missing = [] if allow_missing else [c for c in BATCH_COLUMNS if c not in given]
    if unknown or missing:
        parts = [f"unknown column(s) {', '.join(unknown)}"] if unknown else []
        parts += [f"missing column(s) {', '.join(missing)}"] if missing else []
        raise BatchSchemaError(f"{source}: {'; '.join(parts)} (a batch row has BatchRecord's fields: "
                               f"{', '.join(BATCH_COLUMNS)})")


def encode_batch(record: BatchRecord) -> bytes:
    """The record's JSON form: an object of its fields."""
    return json.dumps(dataclasses.asdict(record), separators=(",", ":")).encode()


def decode_batch(row: dict, source: str) -> BatchRecord:
    """A BatchRecord from its JSON form (``json.loads`` of ``encode_batch``); BatchSchemaError naming ``source``
    when the row's names are not the fields'."""
    if row.keys() != _COLUMN_SET:
        check_columns(row, source, allow_missing=False)
    return BatchRecord(**row)
