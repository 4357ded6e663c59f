"""The flash_attn backend's plumbing on CPU: cache writes, K/V gather, cu_seqlens, one varlen call."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from engine.attention.flash_attn import FlashAttention, flash_attn_available
from engine.attention.metadata import AttentionMetadata, PrefillSeq, bottom_right_causal_mask
from engine.attention.sdpa import SDPAAttention

H, HKV, D, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 16, 4, 32
SCALE = 1 / math.sqrt(D)


def reference_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     dropout_p=0.0, softmax_scale=None, causal=False):
    """Torch stand-in for the CUDA kernel ``flash_attn.flash_attn_varlen_func`` (flash-attn 2.x semantics).

    The kernel is not under test here, the backend's plumbing is. Per sequence ``i``: queries
    ``q[cu_seqlens_q[i]:cu_seqlens_q[i+1]]`` attend to keys/values ``k/v[cu_seqlens_k[i]:cu_seqlens_k[i+1]]``;
    kv heads are repeated for GQA; with ``causal`` the mask is aligned bottom-right; fp32 math.
    """
    assert dropout_p == 0.0
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:], strict=False))
    assert max_seqlen_k == max(b - a for a, b in zip(ck, ck[1:], strict=False))
    for q0, q1, k0, k1 in zip(cq, cq[1:], ck, ck[1:], strict=False):
        qs = q[q0:q1].float().transpose(0, 1)  # [H, n, D]
        ks = k[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        vs = v[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(-1, -2) * scale
        if causal:
            scores = scores.masked_fill(~bottom_right_causal_mask(q1 - q0, k1 - k0, q.device), float("-inf"))
        out[q0:q1] = (scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def _mixed_batch(gen: torch.Generator):
    """3 decodes (lengths 7, 13, 2 incl. the new token), then a fresh 5-token prefill and a 7-token
    chunk after 6 cached tokens; blocks drawn at random so every table is non-contiguous."""
    decode_lens, prefills = [7, 13, 2], [(0, 5), (6, 7)]  # prefills: (context_len, num_tokens)
    totals = decode_lens + [c + n for c, n in prefills]
    perm = torch.randperm(NUM_BLOCKS, generator=gen)
    tables, used = [], 0
    for total in totals:
        nb = -(-total // BLOCK_SIZE) + 1  # one spare block: tables may be longer than needed
        tables.append(perm[used:used + nb])
        used += nb

    def slots(table, positions):
        return [int(table[p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in positions]

    slot_mapping = [s for t, n in zip(tables, decode_lens, strict=False) for s in slots(t, [n - 1])]
    prefill_seqs, start = [], len(decode_lens)
    for (ctx, n), table in zip(prefills, tables[len(decode_lens):], strict=True):
        slot_mapping += slots(table, range(ctx, ctx + n))
        prefill_seqs.append(PrefillSeq(start, n, ctx, table))
        start += n
    width = max(len(t) for t in tables[:len(decode_lens)])
    decode_tables = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables[:len(decode_lens)]])
    return AttentionMetadata(slot_mapping=torch.tensor(slot_mapping), num_decodes=len(decode_lens),
                             decode_block_tables=decode_tables, decode_seq_lens=torch.tensor(decode_lens),
                             prefills=prefill_seqs)


def test_flash_matches_sdpa_on_mixed_gqa_batch():
    gen = torch.Generator().manual_seed(0)
    meta = _mixed_batch(gen)
    num_tokens = meta.slot_mapping.numel()
    # Non-contiguous q/k/v: views into one fused qkv projection output.
    qkv = torch.randn(num_tokens, (H + 2 * HKV) * D, generator=gen)
    q = qkv[:, :H * D].view(num_tokens, H, D)
    k = qkv[:, H * D:(H + HKV) * D].view(num_tokens, HKV, D)
    v = qkv[:, (H + HKV) * D:].view(num_tokens, HKV, D)
    assert not q.is_contiguous() and not k.is_contiguous()

    calls = []

    def recording_varlen(*args, **kwargs):
        calls.append((args, kwargs))
        return reference_flash_attn_varlen_func(*args, **kwargs)

    flash = FlashAttention(H, HKV, D, SCALE, varlen_func=recording_varlen)
    sdpa = SDPAAttention(H, HKV, D, SCALE)
    assert flash.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE) == (NUM_BLOCKS, BLOCK_SIZE, HKV, D)

    # The same per-slot history in both layouts (the context the chunks and decodes read).
    history_k = torch.randn(NUM_BLOCKS, BLOCK_SIZE, HKV, D, generator=gen)
    history_v = torch.randn(NUM_BLOCKS, BLOCK_SIZE, HKV, D, generator=gen)
    flash_k, flash_v = history_k.clone(), history_v.clone()
    sdpa_k, sdpa_v = (h.permute(2, 0, 1, 3).contiguous() for h in (history_k, history_v))
    assert sdpa_k.shape == sdpa.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)

    out = flash(q, k, v, flash_k, flash_v, meta)
    expected = sdpa(q, k, v, sdpa_k, sdpa_v, meta)
    assert out.shape == (num_tokens, H * D)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    # New K/V landed at their slots; every other slot kept its history.
    flat_k, flat_v = flash_k.view(-1, HKV, D), flash_v.view(-1, HKV, D)
    torch.testing.assert_close(flat_k[meta.slot_mapping], k, atol=0, rtol=0)
    torch.testing.assert_close(flat_v[meta.slot_mapping], v, atol=0, rtol=0)
    untouched = torch.ones(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    untouched[meta.slot_mapping] = False
    assert torch.equal(flat_k[untouched], history_k.view(-1, HKV, D)[untouched])
    assert torch.equal(flash_k.permute(2, 0, 1, 3), sdpa_k)  # both backends wrote the same K

    # One varlen call for the whole batch, with flash-attn's argument conventions.
    assert len(calls) == 1
    (_, _, _, cu_q, cu_k, max_q, max_k), kwargs = calls[0]
    assert cu_q.tolist() == [0, 1, 2, 3, 8, 15]
    assert cu_k.tolist() == [0, 7, 20, 22, 27, 40]
    assert (max_q, max_k) == (7, 13)
    assert kwargs == {"softmax_scale": SCALE, "causal": True}


def test_flash_prefill_only_and_decode_only():
    gen = torch.Generator().manual_seed(1)
    full = _mixed_batch(gen)
    nd = full.num_decodes
    prefill_only = AttentionMetadata(full.slot_mapping[nd:], 0, None, None,
                                     [PrefillSeq(p.start - nd, p.num_tokens, p.context_len, p.block_table)
                                      for p in full.prefills])
    decode_only = AttentionMetadata(full.slot_mapping[:nd], nd, full.decode_block_tables,
                                    full.decode_seq_lens, [])
    for meta in (prefill_only, decode_only):
        t = meta.slot_mapping.numel()
        q, k, v = (torch.randn(t, h, D, generator=gen) for h in (H, HKV, HKV))
        cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, HKV, D, generator=gen)
        flash = FlashAttention(H, HKV, D, SCALE, varlen_func=reference_flash_attn_varlen_func)
        out = flash(q, k, v, cache[0].clone(), cache[1].clone(), meta)
        sdpa_cache = cache.permute(0, 3, 1, 2, 4).contiguous()
        expected = SDPAAttention(H, HKV, D, SCALE)(q, k, v, sdpa_cache[0], sdpa_cache[1], meta)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_flash_attn_unavailable_on_cpu():
    assert flash_attn_available(torch.device("cpu"), torch.bfloat16) is False
    assert flash_attn_available(torch.device("cpu"), torch.float32) is False


def test_missing_flash_attn_package_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # makes `import flash_attn` fail even if installed
    with pytest.raises(ValueError, match="flash-attn"):
        FlashAttention(H, HKV, D, SCALE)
    assert flash_attn_available(torch.device("cuda"), torch.bfloat16) is False
