"""The native CPU decode kernel against the portable gather path, and backend selection."""
import shutil

import pytest
import torch

from engine.attention import (
    AttentionMetadata,
    CPUPagedAttention,
    SDPAAttention,
    make_attention_backend,
    native,
)

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                    reason="no C++ compiler to build the kernel")


def decode_batch(seq_lens, num_kv_heads, head_dim, block_size, dtype, seed=0):
    """Caches filled with random K/V, and shuffled, padded block tables for ``seq_lens``."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = -(-max(seq_lens) // block_size)
    num_blocks = len(seq_lens) * max_blocks + 3
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    blocks = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.long)
    for i, length in enumerate(seq_lens):
        n = -(-length // block_size)
        tables[i, :n] = blocks[i * max_blocks:i * max_blocks + n]
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_decodes=len(seq_lens),
                             decode_block_tables=tables, decode_seq_lens=torch.tensor(seq_lens), prefills=[])
    return k_cache, v_cache, meta


@needs_compiler
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(6, 2, 16), (4, 4, 32), (12, 4, 64)])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_matches_gather_path(num_heads, num_kv_heads, head_dim, block_size, dtype, atol):
    seq_lens = [1, block_size, block_size + 1, 37, 3 * block_size, 100]
    k_cache, v_cache, meta = decode_batch(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    # q as the model produces it: a strided view into a wider projection output.
    qkv = torch.randn(len(seq_lens), num_heads + 2 * num_kv_heads, head_dim).to(dtype)
    q = qkv[:, :num_heads]
    scale = head_dim ** -0.5
    expected = SDPAAttention(num_heads, num_kv_heads, head_dim, scale)._decode(q, k_cache, v_cache, meta)
    got = CPUPagedAttention(num_heads, num_kv_heads, head_dim, scale, dtype)._decode(q, k_cache, v_cache, meta)
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=atol)


@needs_compiler
def test_kernel_reads_only_its_own_blocks():
    """Poisoning every block outside the tables (and the padding slots of the last block) changes nothing."""
    k_cache, v_cache, meta = decode_batch([5, 9], num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32)
    q = torch.randn(2, 4, 16)
    backend = CPUPagedAttention(4, 2, 16, 0.25, torch.float32)
    before = backend._decode(q, k_cache, v_cache, meta)
    used = torch.zeros(k_cache.shape[1], k_cache.shape[2], dtype=torch.bool)
    for table, length in zip(meta.decode_block_tables, meta.decode_seq_lens.tolist(), strict=True):
        for t in range(length):
            used[table[t // 4], t % 4] = True
    k_cache[:, ~used], v_cache[:, ~used] = 1e4, -1e4
    torch.testing.assert_close(backend._decode(q, k_cache, v_cache, meta), before)


@needs_compiler
def test_auto_picks_the_native_backend_on_cpu():
    dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=32 ** -0.5)
    cpu = torch.device("cpu")
    assert native.load_paged_decode() is not None
    assert type(make_attention_backend("auto", cpu, torch.bfloat16, **dims)) is CPUPagedAttention
    assert type(make_attention_backend("sdpa", cpu, torch.bfloat16, **dims)) is SDPAAttention
    # head dims without a kernel instantiation fall back to the portable path
    odd = dict(dims, head_dim=24)
    assert type(make_attention_backend("auto", cpu, torch.float32, **odd)) is SDPAAttention


@pytest.mark.parametrize(("name", "dtype", "head_dim", "message"), [
    ("cpu_paged", torch.float32, 24, "head dims"),
    ("cpu_paged", torch.float16, 32, "dtypes"),
    ("flash_attn", torch.bfloat16, 32, "CUDA"),
    ("xformers", torch.float32, 32, "unknown model.attention_backend"),
])
def test_unusable_backend_is_a_clear_error(name, dtype, head_dim, message):
    with pytest.raises(ValueError, match=message):
        make_attention_backend(name, torch.device("cpu"), dtype, num_heads=4, num_kv_heads=2, head_dim=head_dim,
                               scale=1.0)


@pytest.mark.parametrize("compiler", ["no-such-compiler", "false"])  # missing, and one that fails
def test_without_a_working_compiler_auto_falls_back_to_sdpa(compiler, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("STALLFREE_CACHE", str(tmp_path))  # no prebuilt library to find
    monkeypatch.setenv("CXX", compiler)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: real_which(name) if name == compiler else None)
    native.load_paged_decode.cache_clear()
    try:
        assert native.load_paged_decode() is None
        assert "portable" in caplog.text
        dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=1.0)
        cpu = torch.device("cpu")
        assert type(make_attention_backend("auto", cpu, torch.float32, **dims)) is SDPAAttention
        with pytest.raises(ValueError, match="C\\+\\+ compiler"):
            make_attention_backend("cpu_paged", cpu, torch.float32, **dims)
    finally:
        native.load_paged_decode.cache_clear()
