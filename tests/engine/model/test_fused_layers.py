"""The native decoder layer (one call per layer) gives the layers' modules' logits bit for bit, in bf16 on the
tiled linears and in fp32 on the widened ones (bf16 weights on a CPU without native bf16), and runs only where
every part of the layer is native."""
from pathlib import Path

import pytest
import torch
from torch import nn

from stallfree.engine import LLMEngine, SamplingParams, device
from stallfree.engine.attention import make_attention_backend
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.fused_layers import FusedLlamaForCausalLM, fused_kind
from stallfree.engine.model.llama import DecoderLayer, LlamaForCausalLM
from stallfree.engine.model.loader import load_model
from stallfree.engine.model.tensor_parallel import TensorParallel
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.scheduler.output import ScheduledUnit
from tests.helpers.engine import make_prompts, run_staggered
from tests.helpers.tiled import use_tiled_linears

CPU = torch.device("cpu")


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


@pytest.mark.parametrize("kind", ["bf16", "widened_f32"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])  # qwen2: a qkv bias; mistral, qwen2: GQA
def test_fused_layers_give_the_modules_logits_bit_for_bit(kind, arch, arch_paths, monkeypatch, tiled_linears):
    if kind == "widened_f32":  # bf16 as a CPU without native bf16 runs it
        monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    engine = LLMEngine.from_kwargs(model=str(arch_paths[arch]), scheduler="sarathi", chunk_size=16, dtype="bfloat16",
                                   max_num_seqs=4)
    assert type(engine.runner.model) is FusedLlamaForCausalLM and engine.runner.model.fused_kind == kind
    layer_calls = count_layer_calls(monkeypatch)
    fused_outputs, fused_logits = logits_of_a_staggered_run(engine, fused=True)
    assert layer_calls[0] == 0  # the native layer ran, not the modules
    module_outputs, module_logits = logits_of_a_staggered_run(engine, fused=False)
    assert layer_calls[0] > 0
    assert fused_outputs == module_outputs
    assert len(fused_logits) == len(module_logits) > 10
    assert all(torch.equal(a, b) for a, b in zip(fused_logits, module_logits, strict=True))


def test_another_attention_backend_runs_the_modules(tiny_path, monkeypatch, tiled_linears):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), dtype="bfloat16", attention_backend="sdpa")
    assert type(engine.runner.model) is FusedLlamaForCausalLM
    layer_calls = count_layer_calls(monkeypatch)
    outputs, _ = logits_of_a_staggered_run(engine, fused=True)
    assert layer_calls[0] > 0 and len(outputs) == 5


def test_only_all_native_layers_fuse(tiny_path, tiled_linears):
    fp32 = LLMEngine.from_kwargs(model=str(tiny_path), dtype="float32").runner.model  # oneDNN's linears
    assert type(fp32) is LlamaForCausalLM and fused_kind(fp32.layers[0]) is None
    layer = LLMEngine.from_kwargs(model=str(tiny_path), dtype="bfloat16").runner.model.layers[0]
    assert fused_kind(layer) == "bf16"
    layer.self_attn.o_proj = nn.Linear(layer.self_attn.q_size, layer.self_attn.o_proj.out_features, bias=False,
                                       dtype=torch.bfloat16)
    assert fused_kind(layer) is None


def run_fused_tp_rank(rank: int, path: str, rendezvous: str) -> None:
    """One rank of TP2 in bf16: the native layers split at the all-reduces give the sharded modules' logits bit
    for bit, over a prefill of two sequences and a decode step, with the same all-reduces."""
    use_tiled_linears(pytest.MonkeyPatch())
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        arch = ArchConfig.from_dir(Path(path))
        model = load_model(Path(path), arch, 256, torch.bfloat16, CPU, TensorParallel(rank, 2))
        assert type(model) is FusedLlamaForCausalLM and model.tp_reduced
        shard = TensorParallel(rank, 2).shard_arch(arch)
        attn = make_attention_backend("cpu_paged", CPU, torch.bfloat16, num_heads=shard.num_heads,
                                      num_kv_heads=shard.num_kv_heads, head_dim=arch.head_dim,
                                      scale=arch.head_dim ** -0.5)
        params = SamplingParams()
        steps = [[ScheduledUnit("a", list(range(5, 25)), 0, True, True, [0, 1], params),
                  ScheduledUnit("b", list(range(40, 47)), 0, True, True, [2], params)],
                 [ScheduledUnit("a", [3], 20, False, True, [0, 1], params),
                  ScheduledUnit("b", [9], 7, False, True, [2], params)]]
        reduced = []
        all_reduce = torch.distributed.all_reduce

        def counted(tensor, group=None):
            reduced.append(tensor.shape)
            return all_reduce(tensor, group=group)

        logits = {}
        with torch.inference_mode(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.distributed, "all_reduce", counted)
            for fused in (True, False):
                model.fused = fused
                shape = attn.kv_cache_shape(4, 16)
                kv = [(torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
                      for _ in range(arch.num_layers)]
                logits[fused] = []
                for units in steps:
                    input_ids, positions, meta, logits_indices = to_device(prepare_host_batch(units, 16), CPU)
                    logits[fused].append(model(input_ids, positions, attn, kv, meta, logits_indices))
        assert all(torch.equal(a, b) for a, b in zip(logits[True], logits[False], strict=True))
        assert logits[True][1].shape == (2, arch.vocab_size)
        per_pass = 1 + 2 * arch.num_layers  # the embedding's, then one after attention and one after the MLP
        assert len(reduced) == 2 * len(steps) * per_pass
    finally:
        torch.distributed.destroy_process_group()


def test_tp2_native_layers_split_at_the_all_reduce(tiny_path, tmp_path):
    torch.multiprocessing.spawn(run_fused_tp_rank, args=(str(tiny_path), str(tmp_path / "rendezvous")), nprocs=2)
