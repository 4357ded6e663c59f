"""The native CPU paged-attention kernel (decodes and prefill chunks with context) against a float64
reference, and backend selection."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stallfree.engine.attention import CPUPagedAttention, SDPAAttention, make_attention_backend
from stallfree.engine.attention.metadata import bottom_right_causal_mask
from stallfree.engine.native import cpu_kernels as native
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.scheduler.output import ScheduledUnit

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                    reason="no C++ compiler to build the kernel")


def reference(q, k, v, context_len, scale):
    """Attention of q [n, H, D] over k, v [context_len + n, Hkv, D] in float64, mask aligned bottom-right."""
    group = q.shape[1] // k.shape[1]
    qs = q.double().transpose(0, 1)
    ks, vs = (x.double().repeat_interleave(group, dim=1).transpose(0, 1) for x in (k, v))
    scores = qs @ ks.transpose(-1, -2) * scale
    scores = scores.masked_fill(~bottom_right_causal_mask(q.shape[0], context_len + q.shape[0], q.device),
                                float("-inf"))
    return (scores.softmax(-1) @ vs).transpose(0, 1)


class PagedBatch:
    """Sequences of (context_len, num_new) on shuffled blocks: ``prefill_context`` writes every context
    through the backend (as fresh chunks), ``step`` then runs the new tokens (decodes have num_new 1)."""

    def __init__(self, seqs, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.seqs, self.block_size, self.scale = seqs, block_size, head_dim ** -0.5
        self.backend = CPUPagedAttention(num_heads, num_kv_heads, head_dim, self.scale, dtype)
        needed = [-(-(c + n) // block_size) for c, n in seqs]
        num_blocks = sum(needed) + 3
        self.k_cache, self.v_cache = (torch.zeros(self.backend.kv_cache_shape(num_blocks, block_size), dtype=dtype)
                                      for _ in range(2))
        blocks = torch.randperm(num_blocks, generator=g).tolist()
        self.tables = [blocks[sum(needed[:i]):sum(needed[:i + 1])] for i in range(len(seqs))]
        # q as the model produces it: a strided view into a wider projection output.
        width = num_heads + 2 * num_kv_heads
        self.qkv = [torch.randn(c + n, width, head_dim, generator=g).to(dtype) for c, n in seqs]
        self.heads = (num_heads, num_kv_heads)

    def _run(self, parts):
        units = [ScheduledUnit(f"r{i}", [0] * (end - start), start, end - start > 1, True, self.tables[i],
                               SamplingParams()) for i, (start, end) in parts]
        _, _, meta, _ = to_device(prepare_host_batch(units, self.block_size), torch.device("cpu"))
        h, hkv = self.heads
        qkv = torch.cat([self.qkv[i][start:end] for i, (start, end) in parts])
        q, k, v = qkv[:, :h], qkv[:, h:h + hkv].contiguous(), qkv[:, h + hkv:]
        return self.backend(q, k, v, self.k_cache, self.v_cache, meta)

    def prefill_context(self):
        self._run([(i, (0, c)) for i, (c, _) in enumerate(self.seqs) if c])

    def step(self) -> torch.Tensor:
        return self._run([(i, (c, c + n)) for i, (c, n) in enumerate(self.seqs)])

    def expected(self) -> torch.Tensor:
        h, hkv = self.heads
        outs = [reference(x[c:, :h], x[:, h:h + hkv], x[:, h + hkv:], c, self.scale)
                for x, (c, _) in zip(self.qkv, self.seqs, strict=True)]
        return torch.cat(outs).flatten(1)


def mixed_seqs(block_size):
    """Decodes, then fresh and continued prefill chunks: odd lengths, block and tile boundaries."""
    decodes = [(0, 1), (block_size - 1, 1), (block_size, 1), (36, 1), (3 * block_size, 1), (99, 1)]
    chunks = [(0, 1), (0, 7), (2 * block_size - 1, block_size + 3), (130, 70), (200, 5), (block_size, 2 * block_size)]
    return decodes + chunks


@needs_compiler
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(6, 2, 16), (4, 4, 32), (12, 4, 64), (8, 1, 80)])
@pytest.mark.parametrize("block_size", [4, 6, 16, 32])  # keys per micro-tile: 4, 1, 16, 16
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_kernel_matches_reference(num_heads, num_kv_heads, head_dim, block_size, dtype, atol):
    batch = PagedBatch(mixed_seqs(block_size), num_heads, num_kv_heads, head_dim, block_size, dtype)
    batch.prefill_context()
    torch.testing.assert_close(batch.step().double(), batch.expected(), atol=atol, rtol=atol)


@needs_compiler
def test_long_chunk_over_long_context():
    """The issue's shape, scaled down: a chunk spanning several query tiles and key chunks of its context."""
    batch = PagedBatch([(1500, 128), (700, 1)], 12, 4, 64, 16, torch.float32, seed=1)
    batch.prefill_context()
    torch.testing.assert_close(batch.step().double(), batch.expected(), atol=2e-5, rtol=2e-5)


@needs_compiler
def test_kernel_reads_only_its_own_blocks():
    """Poisoning every block outside the tables (and the unused slots of the last blocks) changes nothing."""
    batch = PagedBatch([(5, 1), (6, 3)], 4, 2, 16, 4, torch.float32)
    batch.prefill_context()
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    before = batch.step()
    used = {b for table in batch.tables for b in table}
    unused = [b for b in range(k_cache.shape[1]) if b not in used]
    batch.k_cache.copy_(k_cache)
    batch.v_cache.copy_(v_cache)
    batch.k_cache[:, unused], batch.v_cache[:, unused] = 1e4, -1e4
    for table, (c, n) in zip(batch.tables, batch.seqs, strict=True):  # slots past the sequence in its last block
        used_slots = c + n - (len(table) - 1) * 4
        batch.k_cache[:, table[-1]].view(2, 16, 4)[:, :, used_slots:] = 1e4  # K blocks are [head_dim, block_size]
        batch.v_cache[:, table[-1], used_slots:] = -1e4
    torch.testing.assert_close(batch.step(), before)


@needs_compiler
@pytest.mark.parametrize(("dtype", "block_size"), [(torch.float32, 16), (torch.bfloat16, 16), (torch.bfloat16, 6)])
def test_stale_slots_past_a_sequence_change_nothing(dtype, block_size):
    """Slots past each sequence's end in its last block, written through the backend itself (so in whatever
    layout it keeps, paired bf16 included) with inf and NaN, leave the output unchanged: odd lengths put a
    stale slot beside the last key of a pair."""
    seqs = [(4, 1), (8, 3), (20, 9), (33, 1)]
    batch = PagedBatch(seqs, 6, 2, 32, block_size, dtype)
    batch.prefill_context()
    before = batch.step()
    stale = [(i, c + n, len(batch.tables[i]) * block_size) for i, (c, n) in enumerate(seqs)]
    slots = torch.tensor([batch.tables[i][s // block_size] * block_size + s % block_size
                          for i, end, cap in stale for s in range(end, cap)])
    for value in (float("inf"), float("nan")):
        junk = torch.full((len(slots), 2, 32), value, dtype=dtype)
        batch.backend.write_cache(junk.data_ptr(), junk.stride(0), junk.data_ptr(), junk.stride(0),
                                  batch.k_cache.data_ptr(), batch.v_cache.data_ptr(), slots.data_ptr(), len(slots),
                                  2, 32, batch.k_cache.shape[1], block_size, 1)
        torch.testing.assert_close(batch.step(), before)


def cpu_has_amx() -> bool:
    try:
        return " amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@needs_compiler
@pytest.mark.skipif(not cpu_has_amx(), reason="no AMX: the bf16 tests above already run the AVX512 path")
def test_the_avx512_path_still_matches_where_amx_would_run():
    """With AMX, prefill tasks run on it; STALLFREE_NO_AMX=1 (read once per process) keeps the AVX512-BF16
    path, checked in a fresh process on the shapes that take AMX otherwise."""
    code = ("import torch; from tests.engine.attention.test_attention_cpu import test_kernel_matches_reference as t; "
            "[t(12, 4, 64, bs, torch.bfloat16, 2e-2) for bs in (16, 32)]; t(6, 2, 32, 16, torch.bfloat16, 2e-2)")
    run = subprocess.run([sys.executable, "-c", code], env=os.environ | {"STALLFREE_NO_AMX": "1"},
                         cwd=Path(__file__).parents[3], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


@needs_compiler
def test_auto_picks_the_native_backend_on_cpu():
    dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=32 ** -0.5)
    cpu = torch.device("cpu")
    assert native.load_cpu_kernels() is not None
    assert type(make_attention_backend("auto", cpu, torch.bfloat16, **dims)) is CPUPagedAttention
    assert type(make_attention_backend("sdpa", cpu, torch.bfloat16, **dims)) is SDPAAttention
    # head dims the kernel's vectors do not divide fall back to the portable path
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
    native.load_cpu_kernels.cache_clear()
    try:
        assert native.load_cpu_kernels() is None
        assert "portable" in caplog.text
        dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=1.0)
        cpu = torch.device("cpu")
        assert type(make_attention_backend("auto", cpu, torch.float32, **dims)) is SDPAAttention
        with pytest.raises(ValueError, match="C\\+\\+ compiler"):
            make_attention_backend("cpu_paged", cpu, torch.float32, **dims)
    finally:
        native.load_cpu_kernels.cache_clear()
