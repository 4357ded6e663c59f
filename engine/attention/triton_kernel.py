"""The Triton kernel behind ``TritonAttention`` (imported only when that backend is built: it needs triton)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def find_sequence(query_start_loc, program, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence whose query blocks hold ``program``: sequence s owns the programs from
    ``query_start_loc[s] // BLOCK_Q + s`` on (a binary search over that increasing index)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc + mid) // BLOCK_Q + mid
        if first <= program:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def unified_attention_kernel(
    out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, num_seqs,
    q_stride_t, q_stride_h, out_stride_t, out_stride_h,
    cache_stride_block, cache_stride_slot, cache_stride_head, table_stride,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = find_sequence(query_start_loc, program, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    q_block = program - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)  # row = query token (rows // GROUP) x head of the group (rows % GROUP)
    q_index = q_block * BLOCK_Q + rows // GROUP  # within the sequence's queries
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_index < q_len)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    dim_ok = dims < HEAD_DIM
    q_offsets = (q_start + q_index)[:, None] * q_stride_t + head[:, None] * q_stride_h + dims[None, :]
    queries = tl.load(q + q_offsets, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q_pos = context_len + q_index  # the query's position = the last key it may see

    # Keys this block needs: up to its last query's position.
    num_keys = tl.minimum(context_len + (q_block + 1) * BLOCK_Q, seq_len)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    cols = tl.arange(0, TILE_N)
    for tile_start in range(0, num_keys, TILE_N):
        key_pos = tile_start + cols
        key_ok = key_pos < num_keys
        blocks = tl.load(block_tables + seq * table_stride + key_pos // BLOCK_SIZE, mask=key_ok, other=0)
        kv_offsets = (blocks[:, None] * cache_stride_block + (key_pos % BLOCK_SIZE)[:, None] * cache_stride_slot
                      + kv_head * cache_stride_head + dims[None, :])
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        keys = tl.load(k_cache + kv_offsets, mask=kv_mask, other=0.0)
        values = tl.load(v_cache + kv_offsets, mask=kv_mask, other=0.0)

        scores = tl.dot(queries, tl.trans(keys), input_precision=DOT_PRECISION) * scale
        visible = row_ok[:, None] & key_ok[None, :] & (key_pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        new_max = tl.where(new_max > float("-inf"), new_max, 0.0)  # rows that see nothing yet stay at 0
        probs = tl.exp(scores - new_max[:, None])
        correction = tl.exp(row_max - new_max)
        row_sum = row_sum * correction + tl.sum(probs, axis=1)
        acc = acc * correction[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=DOT_PRECISION)
        row_max = new_max

    result = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    out_offsets = (q_start + q_index)[:, None] * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
    tl.store(out + out_offsets, result.to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
