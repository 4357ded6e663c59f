"""What the engine reports: per-request outputs and one BatchRecord per iteration."""
from __future__ import annotations

from dataclasses import dataclass

from engine.request import RequestMetrics


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # stop | length | abort
    metrics: RequestMetrics


@dataclass
class BatchRecord:
    iteration: int
    start_time: float
    end_time: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    prefill_attention_work: int  # sum over prefill chunks of chunk tokens x (cached context + chunk tokens)
    decode_context_tokens: int  # sum over decodes of their context length
    num_preemptions: int
    num_kv_blocks_used: int
    num_waiting: int
    num_running: int
    # Utilisation (engine/utilization): FLOPs and bytes counted from the shapes; MFU and MBU against this
    # machine's limits (None when unknown); the operator split of sampled iterations (None otherwise).
    model_flops: float = 0.0
    bytes_moved: float = 0.0
    mfu: float | None = None
    mbu: float | None = None
    linear_s: float | None = None
    attention_s: float | None = None
    other_s: float | None = None
