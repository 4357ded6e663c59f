"""AmxLinear (the native AMX kernel, weights packed in tile order) computes what a bf16 nn.Linear computes,
and bf16 CPU models use it where the CPU has AMX and the shape tiles. Where the CPU has no AMX the kernel runs
its reference loop on the same packed weights, so the layout, epilogues and roundings are checked on any CPU."""
import pytest
import torch
from torch import nn

from stallfree.engine.model.amx_linear import AmxLinear, amx_available, can_use_amx_linear, fuse_silu_and_mul
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.llama import MLP, SiluAndMul

CPU = torch.device("cpu")

def reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """In fp32, rounded once: a bf16 nn.Linear rounds the product before it adds the bias."""
    bias = None if linear.bias is None else linear.bias.float()
    return nn.functional.linear(x.float(), linear.weight.float(), bias).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 33, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_amx_linear_matches_linear(rows, bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 64, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    out = AmxLinear(linear)(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 64)
    torch.testing.assert_close(out, reference(linear, x))  # bf16 tolerances: the fp32 sums' order differs


@pytest.mark.parametrize("in_features", [512, 2048])  # the kernel's sliced (K <= 1024) and unsliced paths
@pytest.mark.parametrize("rows", [70, 600])  # 600: two passes over the weight (512 rows, then 88 padded to 96)
def test_amx_linear_matches_linear_on_deep_inputs_of_many_rows(in_features, rows):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 96, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    torch.testing.assert_close(AmxLinear(linear)(x), reference(linear, x))


@pytest.mark.parametrize("rows", [1, 33, 600])
def test_float_output_is_the_bf16_output_in_fp32(rows):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    out = AmxLinear(linear, float_output=True)(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 96)
    assert torch.equal(out, AmxLinear(linear)(x).float())


def test_amx_linear_takes_any_leading_shape_and_strides():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32, dtype=torch.bfloat16)
    x = torch.randn(3, 5, 128, dtype=torch.bfloat16)[..., ::2]  # not contiguous
    torch.testing.assert_close(AmxLinear(linear)(x), reference(linear, x))


def test_what_runs_on_amx():
    square = nn.Linear(64, 64)
    assert can_use_amx_linear(CPU, torch.bfloat16, square) == amx_available()
    assert not can_use_amx_linear(CPU, torch.float32, square)
    assert not can_use_amx_linear(torch.device("cuda"), torch.bfloat16, square)
    assert not can_use_amx_linear(CPU, torch.bfloat16, nn.Linear(48, 64))  # 48 inputs: not whole 32-deep tiles
    assert not can_use_amx_linear(CPU, torch.bfloat16, nn.Linear(64, 80))  # 80 outputs: not whole 32-wide panels


def test_bf16_engine_model_uses_amx_linears(amx_linears):
    from stallfree.engine import LLM, SamplingParams

    llm = LLM("tiny", dtype="bfloat16")
    model = llm.engine.runner.model
    assert isinstance(model.lm_head, AmxLinear) and isinstance(model.layers[0].mlp.down_proj, AmxLinear)
    assert model.layers[0].mlp.gate_up_proj.silu_and_mul
    assert model.lm_head.float_output and not model.layers[0].mlp.down_proj.float_output
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("rows", [1, 33, 600])
@pytest.mark.parametrize("bias", [False, True])
def test_gate_up_with_silu_and_mul_matches_the_unfused_ops(rows, bias):
    torch.manual_seed(0)
    gate_up = nn.Linear(64, 2 * 48, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16) * 2
    fused = AmxLinear(gate_up, silu_and_mul=True)
    assert fused.out_features == 48
    torch.testing.assert_close(fused(x), SiluAndMul()(reference(gate_up, x)))


def test_fuse_silu_and_mul_takes_the_act_into_the_projection(amx_linears):
    cfg = ArchConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                "vocab_size": 64, "rms_norm_eps": 1e-5})
    mlp = MLP(cfg).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    expected = mlp(x)
    fuse_silu_and_mul(mlp, CPU, torch.bfloat16)
    assert isinstance(mlp.gate_up_proj, AmxLinear) and isinstance(mlp.act, nn.Identity)
    torch.testing.assert_close(mlp(x), expected)
