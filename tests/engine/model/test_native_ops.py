"""The native layer ops (engine/native/csrc/layer_ops.cpp) compute what the PyTorch modules they replace compute:
fp32 to rounding, bf16 with the same roundings as the unfused ops. Token equality with HF on models
that use them is in test_engine_correctness.py."""
import pytest
import torch

from stallfree.engine.model.llama import ApplyRotary, RMSNorm, SiluAndMul
from stallfree.engine.model.native_ops import (
    NativeApplyRotary,
    NativeRMSNorm,
    NativeSiluAndMul,
    can_use_native_ops,
    use_native_ops,
)

pytestmark = pytest.mark.skipif(not can_use_native_ops(torch.device("cpu"), torch.float32),
                                reason="no C++ compiler for the native kernels")
DTYPES = [torch.float32, torch.bfloat16]


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:  # a reassociated fp32 sum, or PyTorch's vector exp (AVX2 vs AVX512), may move a value across a
        # bf16 rounding boundary: an ulp or two, rarely (7 of 98,304 SiLU-and-mul outputs on an AVX512 CPU)
        torch.testing.assert_close(actual, expected, rtol=2 ** -6, atol=1e-6)
        assert (actual == expected).float().mean() > 0.98


def make_norm(dim: int, dtype: torch.dtype) -> tuple[RMSNorm, RMSNorm]:
    reference = RMSNorm(dim, eps=1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
    native = RMSNorm(dim, eps=1e-5).to(dtype)
    native.load_state_dict(reference.state_dict())
    native.__class__ = NativeRMSNorm
    return reference, native


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 300])  # 300 x 576 runs on both threads
@torch.inference_mode()
def test_rms_norm_with_and_without_residual(dtype, rows):
    torch.manual_seed(0)
    reference, native = make_norm(576, dtype)
    x, residual = torch.randn(rows, 576, dtype=dtype), torch.randn(rows, 576, dtype=dtype)
    assert_matches(native(x), reference(x))
    expected_out, expected_residual = reference(x, residual)
    out, new_residual = native(x.clone(), residual.clone())
    assert torch.equal(new_residual, expected_residual)  # the add rounds like PyTorch's, exactly
    assert_matches(out, expected_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 9, 200])
@torch.inference_mode()
def test_rotary_in_place_on_views_of_the_qkv_projection(dtype, tokens):
    torch.manual_seed(0)
    heads, kv_heads, head_dim = 6, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    angles = torch.rand(tokens, 1, head_dim) * 6
    cos_sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected_q, expected_k = ApplyRotary()(q, k, cos_sin)
    out_q, out_k = NativeApplyRotary()(q, k, cos_sin)
    assert out_q.data_ptr() == qkv.data_ptr()  # in place
    if dtype == torch.bfloat16:  # nothing reassociated: bit-identical
        assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
    assert_matches(out_q, expected_q)
    assert_matches(out_k, expected_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 64])
@torch.inference_mode()
def test_silu_and_mul(dtype, rows):
    torch.manual_seed(0)
    gate_up = torch.randn(rows, 2 * 1536, dtype=dtype) * 4
    assert_matches(NativeSiluAndMul()(gate_up), SiluAndMul()(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_at_extremes_and_in_the_vector_tail(dtype):
    """Large |gate| (where e^-gate over- or underflows) through the 16-lane path and the scalar tail."""
    gate = torch.tensor([-200.0, -100, -89, -20, -1e-3, 0, 1e-3, 20, 89, 100, 200] * 3)[:21]
    gate_up = torch.cat([gate, torch.linspace(-3, 3, 21)]).to(dtype).repeat(5, 1)
    out = NativeSiluAndMul()(gate_up)
    assert torch.isfinite(out).all()  # e^-gate past fp32's range made NaN (a reciprocal estimate of inf)
    # where e^-gate is capped the result is ~1e-36 where PyTorch's is 0: equal within the tolerance only
    torch.testing.assert_close(out, SiluAndMul()(gate_up), rtol=2 ** -6, atol=1e-6)


def test_use_native_ops_swaps_modules_and_keeps_weights():
    from stallfree.engine.model.arch import ArchConfig
    from stallfree.engine.model.llama import LlamaForCausalLM

    cfg = ArchConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                     "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5})
    model = LlamaForCausalLM(cfg, max_len=32)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    use_native_ops(model)
    kinds = {type(m) for m in model.modules()}
    assert {NativeRMSNorm, NativeApplyRotary, NativeSiluAndMul} <= kinds
    assert not kinds & {RMSNorm, ApplyRotary, SiluAndMul}
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_engine_models_use_native_ops(dtype):
    from stallfree.engine import LLM

    model = LLM("tiny", dtype=dtype).engine.runner.model
    assert isinstance(model.norm, NativeRMSNorm)
    mlp = model.layers[0].mlp  # on AMX the bf16 gate_up projection applies SiLU-and-mul itself
    assert isinstance(mlp.act, NativeSiluAndMul) or getattr(mlp.gate_up_proj, "silu_and_mul", False)
