"""The Triton backend against the sdpa backend: on CUDA where there is a device, else on the CPU under
Triton's interpreter (the ``triton_device`` fixture; skipped without triton).

Dtypes: fp32 and fp16 everywhere; bf16 only on CUDA, because the Triton 3.9 interpreter's bf16 ``tl.dot``
is wrong (errors around 5e10 on a 16x32x16 product) and its bf16 stores truncate, so bf16 kernels
cannot be verified on a CPU.
"""
import pytest
import torch

from stallfree.engine import EngineConfig, LLMEngine, SamplingParams
from stallfree.engine.attention import SDPAAttention, TritonAttention, make_attention_backend
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.scheduler.output import ScheduledUnit
from tests.helpers.engine import TRITON_DTYPES, make_prompts, run_staggered

BLOCK_SIZE = 16
NUM_BLOCKS = 40
MIXED = [(0, 1, False), (16, 1, False), (40, 1, False),  # (context, new tokens, is_prefill)
         (0, 20, True), (33, 18, True), (47, 1, True), (5, 40, True)]
DECODES = [(0, 1, False), (14, 1, False), (15, 1, False), (16, 1, False), (99, 1, False), (299, 1, False)]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def batch(shapes, seed: int, num_blocks: int = NUM_BLOCKS) -> list[ScheduledUnit]:
    """Units of (context, new tokens, is_prefill) over scattered blocks."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_blocks, generator=g).tolist()
    units = []
    for i, (context, new, is_prefill) in enumerate(shapes):
        table = [free.pop() for _ in range(-(-(context + new) // BLOCK_SIZE))]
        units.append(ScheduledUnit(f"r{i}", [3] * new, context, is_prefill, True, table, SamplingParams()))
    return units


def compare_with_sdpa(triton_attn: TritonAttention, units, device: torch.device, dtype: torch.dtype,
                      num_blocks: int = NUM_BLOCKS) -> None:
    """Run one layer's attention of ``units`` through both backends on the same cache contents; the
    reference runs in fp32 on the CPU from the same (rounded) inputs."""
    torch.manual_seed(0)
    h, hkv, d = triton_attn.num_heads, triton_attn.num_kv_heads, triton_attn.head_dim
    sdpa = SDPAAttention(num_heads=h, num_kv_heads=hkv, head_dim=d, scale=triton_attn.scale)
    cpu = torch.device("cpu")
    _, _, meta, _ = to_device(prepare_host_batch(units, BLOCK_SIZE), cpu)
    _, _, meta_dev, _ = to_device(prepare_host_batch(units, BLOCK_SIZE), device)
    num_tokens = sum(u.num_new_tokens for u in units)
    q = torch.randn(num_tokens, h, d).to(dtype)
    k, v = (torch.randn(num_tokens, hkv, d).to(dtype) for _ in range(2))
    # The same cached context in each backend's layout: sdpa [Hkv, NB, bs, D], triton [NB, bs, Hkv, D].
    k_sdpa, v_sdpa = (torch.randn(sdpa.kv_cache_shape(num_blocks, BLOCK_SIZE)).to(dtype) for _ in range(2))
    k_tri, v_tri = (c.permute(1, 2, 0, 3).contiguous().to(device) for c in (k_sdpa, v_sdpa))
    assert k_tri.shape == triton_attn.kv_cache_shape(num_blocks, BLOCK_SIZE)

    k_ref, v_ref = k_sdpa.float(), v_sdpa.float()  # fp32 copies of the rounded values, written by sdpa
    expected = sdpa(q.float(), k.float(), v.float(), k_ref, v_ref, meta)
    actual = triton_attn(q.to(device), k.to(device), v.to(device), k_tri, v_tri, meta_dev)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected, rtol=tol, atol=tol)
    torch.testing.assert_close(k_tri.float().cpu(), k_ref.permute(1, 2, 0, 3))  # new K/V in the same slots
    torch.testing.assert_close(v_tri.float().cpu(), v_ref.permute(1, 2, 0, 3))


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 32), (6, 2, 16), (4, 4, 24)])
def test_triton_matches_sdpa_on_a_mixed_batch(triton_device, num_heads, num_kv_heads, head_dim):
    dims = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, scale=head_dim ** -0.5)
    attn = TritonAttention(**dims, dtype=torch.float32)
    assert not attn.uses_split_kv(to_device(prepare_host_batch(batch(MIXED, 0), BLOCK_SIZE), triton_device)[2],
                                  triton_device)
    compare_with_sdpa(attn, batch(MIXED, seed=num_heads), triton_device, torch.float32)


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize("tile_n", [32, 64])
def test_cuda_tile_shapes_gqa_4_to_1_head_dim_128(triton_device, tile_n, dtype):
    """The shapes CUDA runs (keys per tile 32 or 64, a 4:1 GQA group, head_dim 128), on prefill chunks
    and decodes together."""
    attn = TritonAttention(num_heads=8, num_kv_heads=2, head_dim=128, scale=128 ** -0.5, dtype=dtype,
                           tile_n=tile_n, split_kv_below=0)
    assert (attn.block_m, attn.block_q) == (16, 4)
    compare_with_sdpa(attn, batch(MIXED, seed=tile_n), triton_device, dtype)


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize(("tile_n", "num_segments"), [(16, 16), (32, 4)])
def test_split_kv_decode_matches_sdpa(triton_device, tile_n, num_segments, dtype):
    """Decode-only steps of few sequences split each sequence's keys into segments (some of them empty:
    lengths 1 to 300) and merge the segments' softmax states."""
    attn = TritonAttention(num_heads=8, num_kv_heads=2, head_dim=64, scale=0.125, dtype=dtype, tile_n=tile_n,
                           split_kv_below=1 << 20, num_segments=num_segments)
    units = batch(DECODES, seed=num_segments, num_blocks=64)
    assert attn.uses_split_kv(to_device(prepare_host_batch(units, BLOCK_SIZE), triton_device)[2], triton_device)
    compare_with_sdpa(attn, units, triton_device, dtype, num_blocks=64)


def test_split_kv_only_for_decode_only_steps_below_the_threshold(triton_device):
    attn = TritonAttention(num_heads=8, num_kv_heads=2, head_dim=64, scale=0.125, dtype=torch.float32,
                           split_kv_below=8)
    meta_of = lambda shapes: to_device(prepare_host_batch(batch(shapes, 0), BLOCK_SIZE), triton_device)[2]  # noqa: E731
    assert attn.uses_split_kv(meta_of(DECODES[:3]), triton_device)  # 3 sequences x 2 KV heads < 8
    assert not attn.uses_split_kv(meta_of(DECODES[:4]), triton_device)  # 8 programs fill the "device"
    assert not attn.uses_split_kv(meta_of([(0, 1, False), (0, 5, True)]), triton_device)  # a prefill: never split


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU registry rule; on CUDA triton always runs")
def test_registry_takes_triton_on_cpu_only_under_the_interpreter(triton_device, monkeypatch):
    dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=0.2)
    cpu = torch.device("cpu")
    assert isinstance(make_attention_backend("triton", cpu, torch.float32, **dims), TritonAttention)
    assert not isinstance(make_attention_backend("auto", cpu, torch.float32, **dims), TritonAttention)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="triton"):
        make_attention_backend("triton", cpu, torch.float32, **dims)


@pytest.mark.parametrize("split_kv", [False, pytest.param(True, marks=pytest.mark.slow)])  # ~10-30 s each
def test_engine_with_triton_matches_sdpa_token_for_token(triton_device, tiny_path, monkeypatch, split_kv):
    prompts = make_prompts(4, seed=1, max_len=40)
    outputs = {}
    for backend in ("sdpa", "triton"):
        if split_kv:  # every decode-only step takes the split path
            monkeypatch.setattr("stallfree.engine.attention.triton_unified.num_sms", lambda device: 1 << 20)
        engine = LLMEngine(EngineConfig.from_kwargs(
            model=str(tiny_path), dtype="float32", device=triton_device.type, attention_backend=backend,
            scheduler="sarathi", chunk_size=24, num_blocks=64))
        outputs[backend] = run_staggered(engine, prompts, max_tokens=6, params=SamplingParams(
            max_tokens=6, temperature=0.0, ignore_eos=True))
    assert outputs["triton"] == outputs["sdpa"]
