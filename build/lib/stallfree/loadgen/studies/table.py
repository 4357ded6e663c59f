"""phases.csv: one row per measured iteration of the characterisation studies (docs/results.md)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

FILE = "phases.csv"


@dataclass(frozen=True)
class PhaseRow:
    study: str  # phases | chunking | tiles
    kind: str  # decode | prefill | hybrid | chunk | tile
    repeat: int  # the measured repetition of the shape (0, 1, ...)
    batch_size: int  # sequences in the iteration
    prefill_tokens: int
    decode_tokens: int
    context_tokens: int  # per decode: its context (mean over the decodes); per prefill chunk: tokens cached before it
    chunk_size: int | None  # the token budget that built the iteration (hybrid, chunk, tile rows)
    prompt_tokens: int | None  # chunk rows: the whole prompt's length
    iteration_s: float
    per_token_ms: float
    mfu: float | None
    mbu: float | None
    linear_s: float | None  # the operator split, on sampled iterations (model.op_split_every)
    attention_s: float | None
    other_s: float | None
    model_flops: float
    bytes_moved: float

    @classmethod
    def of(cls, study: str, kind: str, repeat: int, record, *, chunk_size: int | None = None,
           prompt_tokens: int | None = None) -> PhaseRow:
        """From a BatchRecord."""
        seconds = record.end_time - record.start_time
        tokens = record.num_prefill_tokens + record.num_decode_tokens
        if record.num_decode_seqs:
            context = record.decode_context_tokens // record.num_decode_seqs
        else:  # one chunk of c tokens after p cached: work = c x (p + c)
            context = record.prefill_attention_work // record.num_prefill_tokens - record.num_prefill_tokens
        return cls(study, kind, repeat, record.num_prefill_seqs + record.num_decode_seqs, record.num_prefill_tokens,
                   record.num_decode_tokens, context, chunk_size, prompt_tokens, seconds, seconds * 1e3 / tokens,
                   record.mfu, record.mbu, record.linear_s, record.attention_s, record.other_s, record.model_flops,
                   record.bytes_moved)


COLUMNS = [f.name for f in dataclasses.fields(PhaseRow)]
RUN_COLUMNS = ["model", "device", "dtype", "peak_flops", "bandwidth"]  # the same on every row of a run


def write_rows(exp_dir: Path, study: str, rows: list[PhaseRow], run: dict) -> Path:
    """Replace ``study``'s rows of ``exp_dir/phases.csv`` (the other studies' rows stay); return its path."""
    path = exp_dir / FILE
    frame = pd.DataFrame([{**dataclasses.asdict(r), **run} for r in rows], columns=COLUMNS + RUN_COLUMNS)
    if path.is_file():
        kept = pd.read_csv(path)
        frame = pd.concat([kept[kept.study != study], frame], ignore_index=True)
    frame = frame.astype({"chunk_size": "Int64", "prompt_tokens": "Int64"})  # integers or empty
    exp_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)
    return path
