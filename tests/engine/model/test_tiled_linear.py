"""TiledLinear (the native tiled kernel, weights packed in tile order) computes what a bf16 nn.Linear computes
on every path the CPU runs (AMX, AVX512-BF16, the reference loop: each forced in turn), and bf16 CPU models use
it where the CPU has a fast path and the shape tiles. The reference loop runs on any CPU, so the layout,
epilogues and roundings are checked everywhere."""
import pytest
import torch
from torch import nn

from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.llama import MLP, SiluAndMul
from stallfree.engine.model.tiled_linear import (
    PATHS,
    TiledLinear,
    can_use_tiled_linear,
    fast_path_available,
    forced_linear_path,
    fuse_silu_and_mul,
    linear_path,
)
from tests.helpers.tiled import paths_here

CPU = torch.device("cpu")


@pytest.fixture(params=PATHS)
def path(request):
    """Each path of the kernel in turn, forced; those this CPU cannot run are skipped."""
    if request.param not in paths_here():
        pytest.skip(f"this CPU has no {request.param} path")
    with forced_linear_path(request.param):
        yield request.param

def reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """In fp32, rounded once: a bf16 nn.Linear rounds the product before it adds the bias."""
    bias = None if linear.bias is None else linear.bias.float()
    return nn.functional.linear(x.float(), linear.weight.float(), bias).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 2, 3, 12, 13, 15, 16, 17, 33, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_tiled_linear_matches_linear(rows, bias, path):
    torch.manual_seed(0)
    linear = nn.Linear(96, 64, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    out = TiledLinear(linear)(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 64)
    torch.testing.assert_close(out, reference(linear, x))  # bf16 tolerances: the fp32 sums' order differs


@pytest.mark.parametrize("in_features", [512, 2048])  # the kernel's sliced (K <= 1024) and unsliced paths
@pytest.mark.parametrize("rows", [70, 600])  # 600: two passes over the weight (512 rows, then 88 padded to 96)
def test_tiled_linear_matches_linear_on_deep_inputs_of_many_rows(in_features, rows, path):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 96, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    torch.testing.assert_close(TiledLinear(linear)(x), reference(linear, x))


@pytest.mark.parametrize("rows", [1, 33, 600])
def test_float_output_is_the_bf16_output_in_fp32(rows, path):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    out = TiledLinear(linear, float_output=True)(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 96)
    assert torch.equal(out, TiledLinear(linear)(x).float())


def test_tiled_linear_takes_any_leading_shape_and_strides(path):
    torch.manual_seed(0)
    linear = nn.Linear(64, 32, dtype=torch.bfloat16)
    x = torch.randn(3, 5, 128, dtype=torch.bfloat16)[..., ::2]  # not contiguous
    torch.testing.assert_close(TiledLinear(linear)(x), reference(linear, x))


def test_what_runs_on_the_tiled_kernel():
    square = nn.Linear(64, 64)
    assert can_use_tiled_linear(CPU, torch.bfloat16, square) == fast_path_available()
    assert not can_use_tiled_linear(CPU, torch.float32, square)
    assert not can_use_tiled_linear(torch.device("cuda"), torch.bfloat16, square)
    assert not can_use_tiled_linear(CPU, torch.bfloat16, nn.Linear(48, 64))  # 48 inputs: not whole 32-deep tiles
    assert not can_use_tiled_linear(CPU, torch.bfloat16, nn.Linear(64, 80))  # 80 outputs: not whole 32-wide panels


def test_bf16_engine_model_uses_tiled_linears(tiled_linears):
    from stallfree.engine import LLM, SamplingParams

    llm = LLM("tiny", dtype="bfloat16")
    model = llm.engine.runner.model
    assert isinstance(model.lm_head, TiledLinear) and isinstance(model.layers[0].mlp.down_proj, TiledLinear)
    assert model.layers[0].mlp.gate_up_proj.silu_and_mul
    assert model.lm_head.float_output and not model.layers[0].mlp.down_proj.float_output
    assert llm.engine.linear_kernels == f"tiled/{linear_path()}"  # what the startup lines name
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("rows", [1, 33, 600])
@pytest.mark.parametrize("bias", [False, True])
def test_gate_up_with_silu_and_mul_matches_the_unfused_ops(rows, bias, path):
    torch.manual_seed(0)
    gate_up = nn.Linear(64, 2 * 48, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16) * 2
    fused = TiledLinear(gate_up, silu_and_mul=True)
    assert fused.out_features == 48
    torch.testing.assert_close(fused(x), SiluAndMul()(reference(gate_up, x)))


def test_fuse_silu_and_mul_takes_the_act_into_the_projection(tiled_linears):
    cfg = ArchConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                "vocab_size": 64, "rms_norm_eps": 1e-5})
    mlp = MLP(cfg).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    expected = mlp(x)
    fuse_silu_and_mul(mlp, CPU, torch.bfloat16)
    assert isinstance(mlp.gate_up_proj, TiledLinear) and isinstance(mlp.act, nn.Identity)
    torch.testing.assert_close(mlp(x), expected)


def test_the_paths_by_isa():
    """The best path is the CPU's own (AMX over AVX512-BF16 over the loop); forcing one it lacks is an error that
    leaves the best path running."""
    flags = open("/proc/cpuinfo").read()
    expected = "amx" if " amx_bf16" in flags else "avx512_bf16" if " avx512_bf16" in flags else "reference"
    assert linear_path() == expected
    assert fast_path_available() == (expected != "reference")
    for missing in PATHS[PATHS.index(expected) + 1:]:
        with pytest.raises(ValueError, match=missing), forced_linear_path(missing):
            pass
    with forced_linear_path("reference"):
        assert linear_path() == "reference"
    assert linear_path() == expected


@pytest.mark.parametrize("rows", [1, 7, 40])
def test_the_fast_paths_agree_with_the_reference_loop(rows):
    """Each fast path's sums are the reference loop's up to fp32 summation order (well inside a bf16 step)."""
    torch.manual_seed(0)
    linear = nn.Linear(2048, 96, bias=True, dtype=torch.bfloat16)
    x = torch.randn(rows, 2048, dtype=torch.bfloat16)
    tiled = TiledLinear(linear, float_output=True)
    with forced_linear_path("reference"):
        expected = tiled(x)
    for path in paths_here()[1:]:
        with forced_linear_path(path):
            torch.testing.assert_close(tiled(x), expected, rtol=2 ** -7, atol=1e-2)


def test_fp32_models_name_onednn_as_their_linears_kernel():
    from stallfree.engine import LLM

    assert LLM("tiny", dtype="float32").engine.linear_kernels == "onednn"
