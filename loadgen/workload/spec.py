"""RequestSpec: one request of a workload, as every target sends it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestSpec:
    request_id: str
    send_offset_s: float  # seconds from the run start
    prompt_token_ids: list[int]
    max_tokens: int
    prompt: str | None = None  # text form (text workloads): HTTP targets send it instead of the ids
    messages: list[dict] | None = None  # chat messages (text workloads); prompt_token_ids is their rendering
