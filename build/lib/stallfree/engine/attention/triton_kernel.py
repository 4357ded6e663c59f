"""The Triton kernels behind ``TritonAttention`` (imported only when that backend is built: it needs triton).

``unified_attention_kernel``: one program per (block of query tokens of a sequence, KV head), for any
mix of decodes and prefill chunks. ``split_kv_decode_kernel`` + ``split_kv_reduce_kernel``: for
decode-only steps with too few (sequence, KV head) pairs to fill the GPU, each sequence's keys are
cut into ``NUM_SEGMENTS`` segments attended by separate programs, whose partial softmax states are
then merged (vLLM's 3-D "segmented" path of its unified Triton attention).
"""
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
def attend_keys(queries, acc, row_max, row_sum, key_start, key_end, q_pos, row_ok, seq, kv_head,
                k_cache, v_cache, block_tables, scale, cache_stride_block, cache_stride_slot, cache_stride_head,
                table_stride, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The online softmax state (acc, row_max, row_sum) after keys ``key_start .. key_end - 1`` of ``seq``,
    read tile by tile through its block table; row r sees key j iff j <= q_pos[r]."""
    dims = tl.arange(0, HEAD_DIM_PADDED)
    dim_ok = dims < HEAD_DIM
    cols = tl.arange(0, TILE_N)
    for tile_start in range(key_start, key_end, TILE_N):
        key_pos = tile_start + cols
        key_ok = key_pos < key_end
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
    return acc, row_max, row_sum


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
    acc, row_max, row_sum = attend_keys(
        queries, tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32),
        tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
        0, num_keys, q_pos, row_ok, seq, kv_head, k_cache, v_cache, block_tables, scale,
        cache_stride_block, cache_stride_slot, cache_stride_head, table_stride,
        HEAD_DIM, HEAD_DIM_PADDED, BLOCK_SIZE, TILE_N, DOT_PRECISION)

    result = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    out_offsets = (q_start + q_index)[:, None] * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
    tl.store(out + out_offsets, result.to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def split_kv_decode_kernel(
    partial_acc, partial_max, partial_sum, q, k_cache, v_cache, block_tables, seq_lens, scale, num_heads,
    q_stride_t, q_stride_h, cache_stride_block, cache_stride_slot, cache_stride_head, table_stride,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, NUM_SEGMENTS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One decode query (the GQA group's heads) x one segment of its keys: the unnormalised partial
    state goes to ``partial_*`` [num_seqs, num_heads, NUM_SEGMENTS(, HEAD_DIM_PADDED)], fp32."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    seq_len = tl.load(seq_lens + seq)
    tiles_per_segment = tl.cdiv(tl.cdiv(seq_len, TILE_N), NUM_SEGMENTS)
    key_start = segment * tiles_per_segment * TILE_N
    key_end = tl.minimum(key_start + tiles_per_segment * TILE_N, seq_len)  # <= key_start: an empty segment

    rows = tl.arange(0, BLOCK_M)  # row = head of the group
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PADDED)
    queries = tl.load(q + seq * q_stride_t + head[:, None] * q_stride_h + dims[None, :],
                      mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    q_pos = tl.zeros([BLOCK_M], dtype=tl.int32) + seq_len - 1  # a decode sees every key
    acc, row_max, row_sum = attend_keys(
        queries, tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32),
        tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
        key_start, key_end, q_pos, row_ok, seq, kv_head, k_cache, v_cache, block_tables, scale,
        cache_stride_block, cache_stride_slot, cache_stride_head, table_stride,
        HEAD_DIM, HEAD_DIM_PADDED, BLOCK_SIZE, TILE_N, DOT_PRECISION)

    state = (seq * num_heads + head) * NUM_SEGMENTS + segment  # [BLOCK_M]
    tl.store(partial_max + state, row_max, mask=row_ok)
    tl.store(partial_sum + state, row_sum, mask=row_ok)
    tl.store(partial_acc + state[:, None] * HEAD_DIM_PADDED + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def split_kv_reduce_kernel(
    out, partial_acc, partial_max, partial_sum, num_heads, out_stride_t, out_stride_h,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
):
    """Merge one (sequence, head)'s segments: rescale each by exp(its max - the overall max)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    segments = tl.arange(0, NUM_SEGMENTS)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    state = (seq * num_heads + head) * NUM_SEGMENTS + segments
    seg_max = tl.load(partial_max + state)  # -inf for an empty segment
    seg_sum = tl.load(partial_sum + state)
    overall = tl.max(seg_max, axis=0)  # finite: segment 0 holds the first key
    weight = tl.exp(seg_max - overall)
    total = tl.sum(seg_sum * weight, axis=0)
    seg_acc = tl.load(partial_acc + state[:, None] * HEAD_DIM_PADDED + dims[None, :])
    result = tl.sum(seg_acc * weight[:, None], axis=0) / total
    tl.store(out + seq * out_stride_t + head * out_stride_h + dims, result.to(out.dtype.element_ty),
             mask=dims < HEAD_DIM)
