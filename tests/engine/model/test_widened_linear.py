"""WidenedLinear (bf16 weights in tile order, widened to fp32 in the kernel) computes what an fp32 nn.Linear with
its weight rounded to bf16 computes, and ``model.dtype=bfloat16`` on a CPU without native bf16 runs the model in
fp32 on such linears: greedy tokens equal HF transformers' with the weights rounded to bf16, computed in fp32."""
import pytest
import torch
from torch import nn

from stallfree.engine import LLM, SamplingParams, device
from stallfree.engine.device import choose_dtype
from stallfree.engine.model.widened_linear import WidenedLinear, can_widen


def rounded_reference(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return nn.functional.linear(x, linear.weight.to(torch.bfloat16).float(), linear.bias)


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 100, 300])  # 300: two passes over the weight (256 rows)
@pytest.mark.parametrize("in_features, out_features, bias", [(64, 96, True), (2048, 96, False), (768, 1280, True)])
def test_widened_linear_matches_the_rounded_weights_in_fp32(rows, in_features, out_features, bias):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(rows, in_features)
    widened = WidenedLinear(linear)
    assert widened.packed_weight.dtype == torch.bfloat16 and not hasattr(widened, "weight")
    out = widened(x)
    assert out.dtype == torch.float32 and out.shape == (rows, out_features)
    torch.testing.assert_close(out, rounded_reference(linear, x), rtol=1e-5, atol=1e-4)


def test_widened_linear_takes_any_leading_shape_and_strides():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(3, 5, 128)[..., ::2]
    torch.testing.assert_close(WidenedLinear(linear)(x), rounded_reference(linear, x), rtol=1e-5, atol=1e-4)


def test_what_widens():
    assert can_widen(nn.Linear(64, 96))
    assert not can_widen(nn.Linear(48, 64)) and not can_widen(nn.Linear(64, 80))


@pytest.fixture
def no_native_bf16(monkeypatch):
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)


def test_bfloat16_without_native_bf16_is_bf16_weights_computed_in_fp32(no_native_bf16):
    choice = choose_dtype("bfloat16", "cpu")
    assert choice.dtype == torch.float32 and choice.weight_dtype == torch.bfloat16 and choice.name == "bfloat16"
    assert "bf16 weights" in str(choice) and "fp32" in str(choice)
    assert choose_dtype("auto", "cpu").weight_dtype is None  # auto stays fp32 throughout there


def test_greedy_tokens_equal_hf_with_bf16_rounded_weights_in_fp32(no_native_bf16, tiny_path):
    from transformers import AutoModelForCausalLM

    llm = LLM(str(tiny_path), dtype="bfloat16")
    assert llm.engine.dtype == torch.float32 and llm.engine.linear_kernels == "widened/bf16-weights"
    model = llm.engine.runner.model
    assert isinstance(model.lm_head, WidenedLinear) and isinstance(model.layers[0].mlp.down_proj, WidenedLinear)
    fp32 = LLM(str(tiny_path), dtype="float32").engine.utilization.counts
    assert llm.engine.utilization.counts.weight_bytes * 2 == fp32.weight_bytes  # MBU counts the bytes read
    assert llm.engine.utilization.counts.kv_bytes_per_token == fp32.kv_bytes_per_token  # the cache stays fp32
    hf = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(param.to(torch.bfloat16))
    prompts = [[5, 6, 7, 8, 9, 10], [100, 200, 300], list(range(40, 90))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt])
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                               pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == expected
