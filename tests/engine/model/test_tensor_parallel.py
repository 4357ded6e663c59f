"""Tensor-parallel shards of the Llama decoder: which slices a rank reads, and where the all-reduces sit."""
import torch
from safetensors.torch import load_file

from stallfree.engine.model import tensor_parallel
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model, read_shard, weight_files
from stallfree.engine.model.tensor_parallel import AllReduceOutput, TensorParallel
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.scheduler.output import ScheduledUnit


def test_shard_arch_splits_heads_and_mlp(tiny_path):
    arch = ArchConfig.from_dir(tiny_path)  # 4 heads, 2 KV heads, intermediate 256
    shard = TensorParallel(1, 2).shard_arch(arch)
    assert (shard.num_heads, shard.num_kv_heads, shard.intermediate_size, shard.vocab_size) == (2, 1, 128, 1024)
    assert (shard.hidden_size, shard.head_dim) == (arch.hidden_size, arch.head_dim)


def test_each_rank_reads_its_slices(tiny_path):
    full = load_file(str(weight_files(tiny_path)[0]))
    ranks = [read_shard(weight_files(tiny_path)[0], TensorParallel(rank, 2)) for rank in range(2)]
    q, o, down = "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"
    for name, dim in ((q, 0), (o, 1), (down, 1), ("model.layers.0.mlp.up_proj.weight", 0),
                      ("model.embed_tokens.weight", 0), ("lm_head.weight", 0)):
        name = name if name.startswith(("model.", "lm_head")) else f"model.{name}"
        assert torch.equal(torch.cat([r[name] for r in ranks], dim=dim), full[name])
        assert ranks[0][name].shape[dim] * 2 == full[name].shape[dim]
    for name in ("model.norm.weight", "model.layers.0.input_layernorm.weight"):
        assert torch.equal(ranks[1][name], full[name])  # replicated


def test_one_all_reduce_after_attention_and_one_after_the_mlp(tiny_path, monkeypatch):
    """Per forward pass: one all-reduce for the vocab-parallel embedding, two per layer, one all-gather of
    the logits."""
    arch = ArchConfig.from_dir(tiny_path)
    model = load_model(tiny_path, arch, 256, torch.float32, torch.device("cpu"), TensorParallel(0, 2))
    assert all(type(layer.self_attn.o_proj) is AllReduceOutput and type(layer.mlp.down_proj) is AllReduceOutput
               for layer in model.layers)
    assert model.layers[0].self_attn.qkv_proj.out_features == (2 + 2 * 1) * arch.head_dim
    # Count the collectives of one forward pass (what they compute is not tested here: the TP2 runs are).
    reduced: list[torch.Size] = []
    gathered: list[torch.Size] = []
    monkeypatch.setattr(tensor_parallel.torch.distributed, "all_reduce",
                        lambda tensor, group=None: reduced.append(tensor.shape))
    monkeypatch.setattr(tensor_parallel.torch.distributed, "all_gather",
                        lambda parts, tensor, group=None: gathered.append(tensor.shape))
    from stallfree.engine.attention import make_attention_backend
    attn = make_attention_backend("sdpa", torch.device("cpu"), torch.float32, num_heads=2, num_kv_heads=1,
                                  head_dim=arch.head_dim, scale=arch.head_dim ** -0.5)
    unit = ScheduledUnit("r", [5, 6, 7], 0, True, True, [0], SamplingParams())
    input_ids, positions, meta, logits_indices = to_device(prepare_host_batch([unit], 16), torch.device("cpu"))
    shape = attn.kv_cache_shape(1, 16)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(arch.num_layers)]
    with torch.inference_mode():
        logits = model(input_ids, positions, attn, kv, meta, logits_indices)
    assert reduced == [torch.Size([3, arch.hidden_size])] * (1 + 2 * arch.num_layers)
    assert gathered == [torch.Size([1, arch.vocab_size // 2])] and logits.shape == (1, arch.vocab_size)
