"""The Triton backend against the sdpa backend, on CPU under Triton's interpreter (skipped without triton)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: run kernels on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from engine.attention import SDPAAttention, TritonAttention, make_attention_backend  # noqa: E402
from engine.runner.batch_prep import prepare_host_batch, to_device  # noqa: E402
from engine.scheduler.output import ScheduledUnit  # noqa: E402
from tests.engine.helpers import make_prompts, run_staggered  # noqa: E402

BLOCK_SIZE = 16
NUM_BLOCKS = 40


def mixed_batch(seed: int) -> list[ScheduledUnit]:
    """Decodes at several lengths, then prefill chunks without and with context, over scattered blocks."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
    shapes = [(0, 1, False), (16, 1, False), (40, 1, False),  # (context, new tokens, is_prefill)
              (0, 20, True), (33, 18, True), (47, 1, True), (5, 40, True)]
    units = []
    for i, (context, new, is_prefill) in enumerate(shapes):
        table = [free.pop() for _ in range(-(-(context + new) // BLOCK_SIZE))]
        units.append(ScheduledUnit(f"r{i}", [3] * new, context, is_prefill, True, table, SamplingParams()))
    return units


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 32), (6, 2, 16), (4, 4, 24)])
def test_triton_matches_sdpa_on_a_mixed_batch(num_heads, num_kv_heads, head_dim):
    torch.manual_seed(0)
    dims = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, scale=head_dim ** -0.5)
    sdpa, triton_attn = SDPAAttention(**dims), TritonAttention(**dims, dtype=torch.float32)
    units = mixed_batch(seed=num_heads)
    _, _, meta, _ = to_device(prepare_host_batch(units, BLOCK_SIZE), torch.device("cpu"))
    num_tokens = sum(u.num_new_tokens for u in units)
    q = torch.randn(num_tokens, num_heads, head_dim)
    k, v = torch.randn(num_tokens, num_kv_heads, head_dim), torch.randn(num_tokens, num_kv_heads, head_dim)
    # The same cached context in each backend's layout: sdpa [Hkv, NB, bs, D], triton [NB, bs, Hkv, D].
    k_sdpa, v_sdpa = (torch.randn(sdpa.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)) for _ in range(2))
    k_tri, v_tri = (c.permute(1, 2, 0, 3).contiguous() for c in (k_sdpa, v_sdpa))
    assert k_tri.shape == triton_attn.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE)

    expected = sdpa(q, k, v, k_sdpa, v_sdpa, meta)
    actual = triton_attn(q, k, v, k_tri, v_tri, meta)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_tri, k_sdpa.permute(1, 2, 0, 3))  # new K/V written to the same slots
    torch.testing.assert_close(v_tri, v_sdpa.permute(1, 2, 0, 3))


def test_registry_takes_triton_on_cpu_only_under_the_interpreter(monkeypatch):
    dims = dict(num_heads=4, num_kv_heads=2, head_dim=32, scale=0.2)
    cpu = torch.device("cpu")
    assert isinstance(make_attention_backend("triton", cpu, torch.float32, **dims), TritonAttention)
    assert not isinstance(make_attention_backend("auto", cpu, torch.float32, **dims), TritonAttention)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="triton"):
        make_attention_backend("triton", cpu, torch.float32, **dims)


def test_engine_with_triton_matches_sdpa_token_for_token(tiny_path):
    prompts = make_prompts(4, seed=1, max_len=40)
    outputs = {}
    for backend in ("sdpa", "triton"):
        engine = LLMEngine(EngineConfig.from_kwargs(
            model=str(tiny_path), dtype="float32", device="cpu", attention_backend=backend, scheduler="sarathi",
            chunk_size=24, num_blocks=64))
        outputs[backend] = run_staggered(engine, prompts, max_tokens=6, params=SamplingParams(
            max_tokens=6, temperature=0.0, ignore_eos=True))
    assert outputs["triton"] == outputs["sdpa"]
