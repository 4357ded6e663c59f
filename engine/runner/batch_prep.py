"""The flat batch of one iteration, built on the host with array ops (no per-token Python loop)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import AttentionMetadata, PrefillSeq
from engine.scheduler.output import ScheduledUnit


@dataclass
class HostBatch:
    """Host arrays of one iteration, units in scheduler order (decodes first, then prefill chunks)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [num_units + 1] int64: offset of each unit's tokens in the flat batch
    seq_lens: np.ndarray  # [num_units] int64: cached tokens once this step's are written
    block_tables: np.ndarray  # [num_units, max_blocks] int64, padded with block 0
    num_blocks: np.ndarray  # [num_units] int64: real entries per block table row
    logits_indices: np.ndarray  # flat index of the last token of each unit that samples
    num_decodes: int


def prepare_host_batch(units: list[ScheduledUnit], block_size: int) -> HostBatch:
    num_new = np.array([u.num_new_tokens for u in units], dtype=np.int64)
    computed = np.array([u.num_computed_tokens for u in units], dtype=np.int64)
    query_start_loc = np.concatenate(([0], np.cumsum(num_new)))
    num_blocks = np.array([len(u.block_table) for u in units], dtype=np.int64)
    block_tables = np.zeros((len(units), int(num_blocks.max(initial=0))), dtype=np.int64)
    for row, u in enumerate(units):
        block_tables[row, :len(u.block_table)] = u.block_table
    unit_of_token = np.repeat(np.arange(len(units)), num_new)
    positions = np.arange(int(query_start_loc[-1])) - query_start_loc[unit_of_token] + computed[unit_of_token]
    slot_mapping = block_tables[unit_of_token, positions // block_size] * block_size + positions % block_size
    samples = np.array([u.samples for u in units], dtype=bool)
    return HostBatch(
        input_ids=np.concatenate([np.asarray(u.token_ids, dtype=np.int64) for u in units]),
        positions=positions, slot_mapping=slot_mapping, query_start_loc=query_start_loc,
        seq_lens=computed + num_new, block_tables=block_tables, num_blocks=num_blocks,
        logits_indices=query_start_loc[1:][samples] - 1, num_decodes=sum(not u.is_prefill for u in units))


def to_device(batch: HostBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                                               torch.Tensor]:
    """Input ids, positions, attention metadata and logits indices on ``device``: two host->device copies."""
    num_tokens, nd = len(batch.positions), batch.num_decodes
    flat = torch.from_numpy(np.concatenate((batch.input_ids, batch.positions, batch.slot_mapping,
                                            batch.query_start_loc, batch.seq_lens, batch.logits_indices)))
    flat = flat.to(device, non_blocking=True)
    tables = torch.from_numpy(batch.block_tables).to(device, non_blocking=True)
    input_ids, positions, slot_mapping, rest = flat.split([num_tokens] * 3 + [len(flat) - 3 * num_tokens])
    num_seqs = len(batch.seq_lens)
    query_start_loc, seq_lens, logits_indices = rest.split([num_seqs + 1, num_seqs, len(batch.logits_indices)])
    starts, num_new = batch.query_start_loc[:-1].tolist(), np.diff(batch.query_start_loc).tolist()
    context_lens = (batch.seq_lens - np.diff(batch.query_start_loc)).tolist()
    prefills = [PrefillSeq(starts[row], num_new[row], context_lens[row], tables[row, :batch.num_blocks[row]])
                for row in range(nd, num_seqs)]
    meta = AttentionMetadata(
        slot_mapping=slot_mapping, num_decodes=nd, prefills=prefills,
        # contiguous: the native CPU kernel takes the row stride to be the width.
        decode_block_tables=tables[:nd, :int(batch.num_blocks[:nd].max())].contiguous() if nd else None,
        decode_seq_lens=seq_lens[:nd] if nd else None,
        query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=tables,
        max_query_len=max(num_new, default=0), max_seq_len=int(batch.seq_lens.max(initial=0)))
    return input_ids, positions, meta, logits_indices
