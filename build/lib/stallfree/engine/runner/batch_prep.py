"""The flat batch of one iteration, built on the host with array ops (no per-token Python loop)."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from stallfree.engine.attention import AttentionMetadata, PrefillSeq
from stallfree.engine.scheduler.output import ScheduledUnit


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
    # One Python pass over the units for their scalars; token ids and block ids are read by np.fromiter.
    per_unit = np.fromiter(chain.from_iterable(
        (len(u.token_ids), u.num_computed_tokens, len(u.block_table), u.samples, u.is_prefill) for u in units),
        dtype=np.int64, count=5 * len(units)).reshape(-1, 5)
    num_new, computed, num_blocks, samples, is_prefill = per_unit.T
    num_tokens = int(num_new.sum())
    query_start_loc = np.zeros(len(units) + 1, dtype=np.int64)
    np.cumsum(num_new, out=query_start_loc[1:])
    block_tables = np.zeros((len(units), int(num_blocks.max(initial=0))), dtype=np.int64)
    block_tables[np.arange(block_tables.shape[1]) < num_blocks[:, None]] = np.fromiter(
        chain.from_iterable(u.block_table for u in units), dtype=np.int64, count=int(num_blocks.sum()))
    unit_of_token = np.repeat(np.arange(len(units)), num_new)
    positions = np.arange(num_tokens) - query_start_loc[unit_of_token] + computed[unit_of_token]
    slot_mapping = block_tables[unit_of_token, positions // block_size] * block_size + positions % block_size
    return HostBatch(
        input_ids=np.fromiter(chain.from_iterable(u.token_ids for u in units), dtype=np.int64, count=num_tokens),
        positions=positions, slot_mapping=slot_mapping, query_start_loc=query_start_loc,
        seq_lens=computed + num_new, block_tables=block_tables, num_blocks=num_blocks,
        logits_indices=query_start_loc[1:][samples.astype(bool)] - 1, num_decodes=len(units) - int(is_prefill.sum()))


def to_device(batch: HostBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                                               torch.Tensor]:
    """Input ids, positions, attention metadata and logits indices on ``device``: two host->device copies."""
    num_tokens, nd = len(batch.positions), batch.num_decodes
    flat = torch.from_numpy(np.concatenate((batch.input_ids, batch.positions, batch.slot_mapping,
                                            batch.query_start_loc, batch.seq_lens, batch.logits_indices)))
    flat = flat.to(device, non_blocking=True)
    tables = torch.from_numpy(batch.block_tables).to(device, non_blocking=True)
    num_seqs = len(batch.seq_lens)
    input_ids, positions, slot_mapping, query_start_loc, seq_lens, logits_indices = flat.split(
        [num_tokens] * 3 + [num_seqs + 1, num_seqs, len(batch.logits_indices)])
    num_new = np.diff(batch.query_start_loc)
    prefill_rows = zip(batch.query_start_loc[nd:-1].tolist(), num_new[nd:].tolist(),
                       (batch.seq_lens - num_new)[nd:].tolist(), batch.num_blocks[nd:].tolist(), strict=True)
    prefills = [PrefillSeq(start, n, context_len, tables[row, :nb])
                for row, (start, n, context_len, nb) in enumerate(prefill_rows, start=nd)]
    meta = AttentionMetadata(
        slot_mapping=slot_mapping, num_decodes=nd, prefills=prefills,
        decode_block_tables=tables[:nd, :int(batch.num_blocks[:nd].max())] if nd else None,
        decode_seq_lens=seq_lens[:nd] if nd else None,
        query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=tables,
        max_query_len=int(num_new.max(initial=0)), max_seq_len=int(batch.seq_lens.max(initial=0)),
        num_kv_tokens=int(batch.seq_lens.sum()))
    return input_ids, positions, meta, logits_indices
