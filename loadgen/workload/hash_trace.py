"""Traces that name each prompt's blocks by hash id (the Mooncake trace format: one JSON object a line with
``timestamp`` in ms, ``input_length``, ``output_length`` and ``hash_ids``, one id per block of the trace's
block size). Equal ids become equal token blocks, so a replay reproduces the trace's prefix reuse on any server.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stallfree.engine.config_checks import is_int, is_number, require
from stallfree.loadgen.workload.prefix_reuse import TokenIds

TRACES_DIR = Path(__file__).parent / "traces"


@dataclass(frozen=True)
class HashTraceRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def trace_path(name: str) -> Path:
    """A bundled trace's name (``mooncake_conversation``) or a path to a ``.jsonl`` file."""
    return Path(name).expanduser() if name.endswith(".jsonl") else TRACES_DIR / f"{name}.jsonl"


def is_hash_trace(name: str) -> bool:
    return trace_path(name).is_file()


def _row(line: str) -> HashTraceRow:
    """One line as a row; ValueError saying what is wrong."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    missing = [key for key in ("timestamp", "input_length", "output_length", "hash_ids") if key not in data]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    if not is_number(data["timestamp"]) or data["timestamp"] < 0:
        raise ValueError(f"timestamp must be a number >= 0, got {data['timestamp']!r}")
    for key in ("input_length", "output_length"):
        if not is_int(data[key]) or data[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {data[key]!r}")
    ids = data["hash_ids"]
    if not isinstance(ids, list) or not all(is_int(h) for h in ids):
        raise ValueError("hash_ids must be a list of integers")
    return HashTraceRow(float(data["timestamp"]), data["input_length"], data["output_length"], tuple(ids))


@functools.cache
def load_hash_trace(name: str) -> tuple[HashTraceRow, ...]:
    """The rows of a hash-id trace; ValueError naming the file, the line and what is wrong with it (timestamps
    must not go backwards)."""
    path = trace_path(name)
    if not path.is_file():
        bundled = sorted(p.stem for p in TRACES_DIR.glob("*.jsonl"))
        raise ValueError(f"trace name {name!r}: no file {path} (bundled hash-id traces: {bundled})")
    rows: list[HashTraceRow] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = _row(line)
            if rows and row.timestamp_ms < rows[-1].timestamp_ms:
                raise ValueError(f"timestamp {row.timestamp_ms:g} goes back from {rows[-1].timestamp_ms:g}")
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no requests")
    return tuple(rows)


def hash_trace_columns(name: str) -> dict[str, np.ndarray]:
    """A hash-id trace as the columns of a length trace (arrived_at in s, prefill and decode tokens)."""
    rows = load_hash_trace(name)
    return {"arrived_at": np.array([r.timestamp_ms / 1000 for r in rows]),
            "num_prefill_tokens": np.array([r.input_length for r in rows]),
            "num_decode_tokens": np.array([r.output_length for r in rows])}


def hash_trace(rng: np.random.Generator, draw: TokenIds, name: str, block_size: int = 512,
               scale: float = 1.0) -> list[tuple[list[int], int]]:
    """The first ``num_requests`` rows of a hash-id trace, in file order, as (prompt, output length): each hash id
    a block of ``block_size / scale`` random tokens, drawn once and reused wherever the id recurs; prompt and
    output lengths divided by ``scale`` (rounded, at least 1). A prompt that ends inside its last block is cut
    there; one longer than its blocks gets random tokens of its own for the rest."""
    require(is_int(block_size) and block_size >= 1, "lengths.block_size", "an integer >= 1", block_size)
    require(is_number(scale) and scale > 0 and block_size / scale >= 1, "lengths.scale",
            f"a number in (0, block_size = {block_size}]", scale)
    try:
        rows = load_hash_trace(name)
    except ValueError as e:
        raise ValueError(f"lengths.name: {e}") from None
    require(draw.num_requests <= len(rows), "num_requests", f"<= the {len(rows)} rows of trace {name!r}",
            draw.num_requests)
    tokens_per_block = round(block_size / scale)
    blocks: dict[int, list[int]] = {}
    requests = []
    for row in rows[:draw.num_requests]:
        length = max(1, round(row.input_length / scale))
        prompt: list[int] = []
        for hash_id in row.hash_ids[:-(-length // tokens_per_block)]:
            if hash_id not in blocks:
                blocks[hash_id] = rng.integers(draw.low, draw.high, size=tokens_per_block).tolist()
            prompt += blocks[hash_id]
        if len(prompt) < length:
            prompt += rng.integers(draw.low, draw.high, size=length - len(prompt)).tolist()
        requests.append((prompt[:length], max(1, round(row.output_length / scale))))
    return requests
