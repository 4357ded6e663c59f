"""The native decoder layer (one call per layer) gives the layers' modules' logits bit for bit, and runs only
where every part of the layer is native."""
import pytest
import torch
from torch import nn

from stallfree.engine import LLMEngine
from stallfree.engine.model.amx_linear import amx_available
from stallfree.engine.model.fused_layers import FusedLlamaForCausalLM, can_fuse
from stallfree.engine.model.llama import DecoderLayer, LlamaForCausalLM
from stallfree.engine.model.packed_linear import PackedLinear
from tests.helpers.engine import make_prompts, run_staggered

needs_amx = pytest.mark.skipif(not amx_available(), reason="no AMX on this CPU (or Linux refuses its tile state)")


def logits_of_a_staggered_run(engine: LLMEngine, fused: bool) -> tuple[dict, list[torch.Tensor]]:
    """Outputs and every iteration's logits: prefill chunks, decodes and iterations with both."""
    engine.runner.model.fused = fused
    captured: list[torch.Tensor] = []
    hook = engine.runner.model.lm_head.register_forward_hook(lambda mod, args, out: captured.append(out.clone()))
    outputs = run_staggered(engine, make_prompts(5, seed=4), 10)
    hook.remove()
    return outputs, captured


def count_layer_calls(monkeypatch) -> list[int]:
    calls = [0]
    forward = DecoderLayer.forward

    def counted(self, *args):
        calls[0] += 1
        return forward(self, *args)

    monkeypatch.setattr(DecoderLayer, "forward", counted)
    return calls


@needs_amx
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])  # qwen2: a qkv bias; mistral, qwen2: GQA
def test_fused_layers_give_the_modules_logits_bit_for_bit(arch, arch_paths, monkeypatch):
    engine = LLMEngine.from_kwargs(model=str(arch_paths[arch]), scheduler="sarathi", chunk_size=16, dtype="bfloat16",
                                   max_num_seqs=4)
    assert type(engine.runner.model) is FusedLlamaForCausalLM
    layer_calls = count_layer_calls(monkeypatch)
    fused_outputs, fused_logits = logits_of_a_staggered_run(engine, fused=True)
    assert layer_calls[0] == 0  # the native layer ran, not the modules
    module_outputs, module_logits = logits_of_a_staggered_run(engine, fused=False)
    assert layer_calls[0] > 0
    assert fused_outputs == module_outputs
    assert len(fused_logits) == len(module_logits) > 10
    assert all(torch.equal(a, b) for a, b in zip(fused_logits, module_logits, strict=True))


@needs_amx
def test_another_attention_backend_runs_the_modules(tiny_path, monkeypatch):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="bfloat16", attention_backend="sdpa")
    assert type(engine.runner.model) is FusedLlamaForCausalLM
    layer_calls = count_layer_calls(monkeypatch)
    outputs, _ = logits_of_a_staggered_run(engine, fused=True)
    assert layer_calls[0] > 0 and len(outputs) == 5


def test_only_all_native_layers_fuse(tiny_path):
    fp32 = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32").runner.model
    assert type(fp32) is LlamaForCausalLM and not can_fuse(fp32.layers[0])
    if not amx_available():
        return
    layer = LLMEngine.from_kwargs(model=str(tiny_path), dtype="bfloat16").runner.model.layers[0]
    assert can_fuse(layer)
    layer.self_attn.o_proj = PackedLinear(nn.Linear(layer.self_attn.q_size, layer.self_attn.o_proj.out_features,
                                                    bias=False, dtype=torch.bfloat16))
    assert not can_fuse(layer)
