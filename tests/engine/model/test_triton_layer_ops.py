"""The Triton layer ops (add+RMSNorm, rotary in place, SiLU-and-mul) against the PyTorch modules they
replace: on CUDA where there is a device, else on the CPU under Triton's interpreter (``triton_device``).

fp32 and fp16 everywhere; bf16 only on CUDA: the Triton 3.9 interpreter truncates bf16 stores instead
of rounding them, so bf16 rounding cannot be verified on a CPU. Each kernel rounds where the eager ops
round, so fp16 results match exactly, not within a tolerance.
"""
import copy

import pytest
import torch

from stallfree.engine import EngineConfig, LLMEngine, SamplingParams
from stallfree.engine.model.llama import ApplyRotary, RMSNorm, RotaryEmbedding, SiluAndMul
from stallfree.engine.model.triton_ops import (
    TRITON_MODULES,
    TritonApplyRotary,
    TritonRMSNorm,
    TritonSiluAndMul,
    use_triton_ops,
)
from tests.helpers.engine import TRITON_DTYPES, make_prompts, run_staggered


def exact(dtype: torch.dtype) -> dict:
    """fp16: the same rounding, so equal; fp32 (and bf16): sums taken in another order."""
    return dict(rtol=0, atol=0) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize("dim", [96, 128])
def test_add_rms_norm_matches_torch(triton_device, dtype, dim):
    torch.manual_seed(0)
    norm = RMSNorm(dim, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(dim))
    norm = norm.to(dtype)
    fused = copy.deepcopy(norm).to(triton_device)
    fused.__class__ = TritonRMSNorm
    x, residual = (torch.randn(5, dim).to(dtype) for _ in range(2))

    expected = norm(x)
    actual = fused(x.to(triton_device))
    torch.testing.assert_close(actual.cpu(), expected, **exact(dtype))

    expected_out, expected_residual = norm(x, residual)
    x_dev, residual_dev = x.to(triton_device), residual.to(triton_device)
    out, new_residual = fused(x_dev, residual_dev)
    torch.testing.assert_close(new_residual.cpu(), expected_residual, rtol=0, atol=0)  # x + residual, rounded
    torch.testing.assert_close(out.cpu(), expected_out, **exact(dtype))
    assert out.data_ptr() == x_dev.data_ptr() and new_residual.data_ptr() == residual_dev.data_ptr()  # in place


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 32), (6, 2, 24)])
def test_rotary_in_place_matches_torch(triton_device, dtype, num_heads, num_kv_heads, head_dim):
    """Q and K as views of one fused qkv projection output, rotated in place."""
    torch.manual_seed(1)
    tokens = 7
    cfg = type("Arch", (), dict(head_dim=head_dim, rope_theta=1e4, rope_scaling=None))
    cos_sin = RotaryEmbedding(cfg, max_len=64)(torch.tensor([0, 1, 5, 9, 30, 31, 63]), dtype)
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim

    def split(t):
        q, k, _ = t.split([q_size, kv_size, kv_size], dim=-1)
        return q.view(tokens, num_heads, head_dim), k.view(tokens, num_kv_heads, head_dim)

    expected_q, expected_k = ApplyRotary()(*split(qkv), cos_sin)
    qkv_dev = qkv.to(triton_device)
    q, k = TritonApplyRotary()(*split(qkv_dev), tuple(c.to(triton_device) for c in cos_sin))
    torch.testing.assert_close(q.cpu(), expected_q, **exact(dtype))
    torch.testing.assert_close(k.cpu(), expected_k, **exact(dtype))
    assert torch.equal(qkv_dev[:, q_size + kv_size:].cpu(), qkv[:, q_size + kv_size:])  # V untouched


@pytest.mark.parametrize("dtype", TRITON_DTYPES)
@pytest.mark.parametrize("dim", [80, 1500])  # 1500: two column blocks of 1024, the second partial
def test_silu_and_mul_matches_torch(triton_device, dtype, dim):
    torch.manual_seed(2)
    gate_up = (2 * torch.randn(3, 2 * dim)).to(dtype)
    expected = SiluAndMul()(gate_up)
    actual = TritonSiluAndMul()(gate_up.to(triton_device))
    torch.testing.assert_close(actual.cpu(), expected, **exact(dtype))


def test_use_triton_ops_swaps_every_module_in_place():
    layers = torch.nn.ModuleList([RMSNorm(8, 1e-6), ApplyRotary(), SiluAndMul(), torch.nn.Linear(2, 2)])
    weight = layers[0].weight
    use_triton_ops(layers)
    assert [type(m) for m in layers] == [TritonRMSNorm, TritonApplyRotary, TritonSiluAndMul, torch.nn.Linear]
    assert layers[0].weight is weight


@pytest.mark.slow  # 8-15 s under the interpreter
def test_engine_with_triton_attention_and_layer_ops_matches_sdpa_token_for_token(triton_device, tiny_path):
    """The CUDA serving path's kernels together (fp32): triton attention and every layer op in Triton."""
    prompts = make_prompts(3, seed=4, max_len=30)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("sdpa", "triton"):
        engine = LLMEngine(EngineConfig.from_kwargs(
            model=str(tiny_path), dtype="float32", device=triton_device.type, attention_backend=backend,
            scheduler="sarathi", chunk_size=16, num_blocks=32))
        if backend == "triton":  # on the CPU the loader put in the native ops: replace them (CUDA loads these)
            for module in engine.runner.model.modules():
                for base, fused in TRITON_MODULES.items():
                    if isinstance(module, base):
                        module.__class__ = fused
            assert isinstance(engine.runner.model.layers[0].mlp.act, TritonSiluAndMul)
        outputs[backend] = run_staggered(engine, prompts, max_tokens=5, params=params)
    assert outputs["triton"] == outputs["sdpa"]
