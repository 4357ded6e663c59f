"""What a backend needs to know about one flat batch: where new K/V go and which blocks each sequence reads."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillSeq:
    start: int  # offset of its tokens in the flat batch
    num_tokens: int
    context_len: int  # tokens already in the cache before this chunk
    block_table: torch.Tensor  # [num_blocks] int64


@dataclass
class AttentionMetadata:
    """Flat batch layout: decode tokens first (one per sequence), then prefill chunks."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] int64, padded with block 0
    decode_seq_lens: torch.Tensor | None  # [num_decodes] int64: cached tokens including the new one
    prefills: list[PrefillSeq]
    per_batch: dict = field(default_factory=dict)  # what a backend derives once and reuses in every layer
    # The same batch as one list of sequences (decodes first, then prefill chunks), for backends that
    # attend over all of them in one launch (triton). Filled by the ModelRunner.
    query_start_loc: torch.Tensor | None = None  # [num_seqs + 1] int64: offset of each sequence's queries
    seq_lens: torch.Tensor | None = None  # [num_seqs] int64: cached tokens including this step's
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks] int64, padded with block 0
    max_query_len: int = 0
    max_seq_len: int = 0
    num_kv_tokens: int = 0  # sum of seq_lens (host int)


def bottom_right_causal_mask(num_queries: int, num_keys: int, device) -> torch.Tensor:
    """Query i (the last ``num_queries`` positions) sees key j iff j <= (num_keys - num_queries) + i."""
    q_pos = torch.arange(num_keys - num_queries, num_keys, device=device).unsqueeze(1)
    return torch.arange(num_keys, device=device).unsqueeze(0) <= q_pos
