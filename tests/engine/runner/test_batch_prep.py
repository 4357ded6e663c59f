"""Host batch preparation against a per-token reference, and the CUDA-graph bucket arithmetic."""
import torch

from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.runner.cuda_graphs import batch_size_buckets, bucket_for
from stallfree.engine.scheduler.output import ScheduledUnit

BLOCK_SIZE = 4


def unit(rid, tokens, computed, table, *, is_prefill, samples=True):
    return ScheduledUnit(rid, tokens, computed, is_prefill, samples, table, SamplingParams())


UNITS = [unit("d0", [11], 6, [5, 2], is_prefill=False), unit("d1", [12], 0, [7], is_prefill=False),
         unit("p0", list(range(20, 29)), 0, [1, 9, 3], is_prefill=True, samples=False),
         unit("p1", list(range(40, 46)), 5, [0, 4, 8], is_prefill=True)]


def test_host_batch_matches_the_per_token_layout():
    batch = prepare_host_batch(UNITS, BLOCK_SIZE)
    ids, positions, slots = [], [], []
    for u in UNITS:
        for i, token in enumerate(u.token_ids):
            pos = u.num_computed_tokens + i
            ids.append(token)
            positions.append(pos)
            slots.append(u.block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
    assert batch.input_ids.tolist() == ids
    assert batch.positions.tolist() == positions
    assert batch.slot_mapping.tolist() == slots
    assert batch.query_start_loc.tolist() == [0, 1, 2, 11, 17]
    assert batch.seq_lens.tolist() == [7, 1, 9, 11]
    assert batch.logits_indices.tolist() == [0, 1, 16]  # p0 is a partial chunk: it samples nothing
    assert batch.block_tables.tolist() == [[5, 2, 0], [7, 0, 0], [1, 9, 3], [0, 4, 8]]


def test_device_metadata_keeps_the_per_backend_fields():
    input_ids, positions, meta, logits_indices = to_device(prepare_host_batch(UNITS, BLOCK_SIZE),
                                                           torch.device("cpu"))
    assert meta.num_decodes == 2
    assert meta.decode_block_tables.tolist() == [[5, 2], [7, 0]]  # only as wide as the decodes need
    assert meta.decode_seq_lens.tolist() == [7, 1]
    assert [(p.start, p.num_tokens, p.context_len, p.block_table.tolist()) for p in meta.prefills] == [
        (2, 9, 0, [1, 9, 3]), (11, 6, 5, [0, 4, 8])]
    assert (meta.max_query_len, meta.max_seq_len) == (9, 11)
    assert input_ids.dtype == positions.dtype == meta.slot_mapping.dtype == logits_indices.dtype == torch.long


def test_prefill_only_batch_has_no_decode_fields():
    _, positions, meta, logits_indices = to_device(prepare_host_batch(UNITS[2:], BLOCK_SIZE), torch.device("cpu"))
    assert meta.num_decodes == 0 and meta.decode_block_tables is None and meta.decode_seq_lens is None
    assert positions.tolist() == list(range(9)) + list(range(5, 11))
    assert meta.block_tables.tolist() == [[1, 9, 3], [0, 4, 8]]
    assert logits_indices.tolist() == [14]


def test_batch_size_buckets_double_up_to_max_num_seqs():
    assert batch_size_buckets(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert batch_size_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert batch_size_buckets(1) == [1]
    buckets = batch_size_buckets(100)
    assert [bucket_for(n, buckets) for n in (1, 3, 8, 65, 100)] == [1, 4, 8, 100, 100]
    assert bucket_for(101, buckets) is None
