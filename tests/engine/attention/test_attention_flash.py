"""The flash_attn backend's plumbing on CPU: cache writes, K/V gather, cu_seqlens, one varlen call."""
from __future__ import annotations

import math
import sys
from itertools import accumulate

import pytest
import torch

from stallfree.engine.attention.flash_attn import FlashAttention, flash_attn_available
from stallfree.engine.attention.metadata import AttentionMetadata, PrefillSeq, bottom_right_causal_mask
from stallfree.engine.attention.sdpa import SDPAAttention
from stallfree.engine.attention.triton_unified import TritonAttention

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
    return batch_metadata(torch.tensor(slot_mapping), tables[:len(decode_lens)], decode_lens, prefill_seqs)


def padded(tables: list[torch.Tensor]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables])


def batch_metadata(slot_mapping, decode_tables: list[torch.Tensor], decode_lens: list[int],
                   prefills: list[PrefillSeq]) -> AttentionMetadata:
    """Both views of one batch, as ``to_device`` builds them: the decode/prefill fields and the unified
    list of sequences (decodes first) that flash_attn reads."""
    seq_lens = decode_lens + [p.context_len + p.num_tokens for p in prefills]
    query_lens = [1] * len(decode_lens) + [p.num_tokens for p in prefills]
    return AttentionMetadata(
        slot_mapping=slot_mapping, num_decodes=len(decode_lens),
        decode_block_tables=padded(decode_tables) if decode_tables else None,
        decode_seq_lens=torch.tensor(decode_lens) if decode_lens else None, prefills=prefills,
        query_start_loc=torch.tensor([0, *accumulate(query_lens)]), seq_lens=torch.tensor(seq_lens),
        block_tables=padded(decode_tables + [p.block_table for p in prefills]), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), num_kv_tokens=sum(seq_lens))


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
    prefill_only = batch_metadata(full.slot_mapping[nd:], [], [],
                                  [PrefillSeq(p.start - nd, p.num_tokens, p.context_len, p.block_table)
                                   for p in full.prefills])
    decode_only = batch_metadata(full.slot_mapping[:nd], list(full.decode_block_tables), full.decode_seq_lens.tolist(),
                                 [])
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


def test_varlen_layout_never_waits_for_the_device():
    """No op that needs a device value on the host (``.item()``/``int()`` -> _local_scalar_dense, a
    boolean-mask index -> nonzero): on CUDA either would sync every step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    meta = _mixed_batch(torch.Generator().manual_seed(2))
    flash = FlashAttention(H, HKV, D, SCALE, varlen_func=reference_flash_attn_varlen_func)
    with RecordOps() as recorder:
        slots, *_ = flash._varlen_layout(meta, BLOCK_SIZE, torch.device("cpu"))
    assert recorder.ops and not [op for op in recorder.ops if op.startswith(("_local_scalar_dense", "nonzero"))]
    assert slots.numel() == meta.num_kv_tokens == 40


@pytest.fixture
def broken_flash_attn(tmp_path, monkeypatch):
    """A flash_attn package that is installed but fails to import, as one built against another torch does."""
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text(
        'raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)


def test_a_broken_flash_attn_makes_auto_fall_back_with_a_warning(broken_flash_attn, monkeypatch, caplog):
    import stallfree.engine.attention as attention
    cuda = torch.device("cuda")
    assert flash_attn_available(cuda, torch.bfloat16) is False
    assert "installed but does not import" in caplog.text and "undefined symbol" in caplog.text
    monkeypatch.setattr(TritonAttention, "available", staticmethod(lambda device, dtype, head_dim: False))
    assert attention.auto_backend(cuda, torch.bfloat16, head_dim=128) == "sdpa"
    with pytest.raises(ValueError, match="undefined symbol"):  # chosen explicitly: a clear error
        FlashAttention(H, HKV, D, SCALE)


def test_auto_prefers_the_graph_safe_triton_backend_on_cuda(monkeypatch):
    import stallfree.engine.attention as attention
    monkeypatch.setattr(FlashAttention, "available", staticmethod(lambda device, dtype, head_dim: True))
    monkeypatch.setattr(TritonAttention, "available", staticmethod(lambda device, dtype, head_dim: True))
    assert attention.auto_backend(torch.device("cuda"), torch.bfloat16, head_dim=128) == "triton"
    monkeypatch.setattr(TritonAttention, "available", staticmethod(lambda device, dtype, head_dim: False))
    assert attention.auto_backend(torch.device("cuda"), torch.bfloat16, head_dim=128) == "flash_attn"
    assert not getattr(FlashAttention, "cuda_graph_safe", False)
