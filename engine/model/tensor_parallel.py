"""Megatron-style tensor parallelism of the Llama decoder: which slice of each weight a rank holds, and the
all-reduce after the row-parallel projections.

A rank's shard of a layer is a Llama layer with ``num_heads / size`` attention heads, ``num_kv_heads / size``
KV heads and ``intermediate_size / size`` MLP columns: QKV and gate/up are split by output rows (column
parallel), o_proj and down_proj by input columns (row parallel), so each rank's o_proj and down_proj give a
partial sum of the full output, and one all-reduce after each makes it whole. The embedding and the LM head are split by vocabulary
rows: a token id outside a rank's rows embeds as zeros there, and an all-reduce sums each token's one
non-zero row; each rank's LM head gives its slice of the logits, and an all-gather joins them. Norms are
replicated. The KV cache of a rank holds its KV heads only. Every step is exact (sums with zeros, slices),
so a sharded model computes what the whole one does but for the order of the all-reduced sums.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.llama import LlamaForCausalLM

# HF weight name suffix -> the dimension it is split along: column-parallel weights (and biases) by output
# rows, row-parallel ones by input columns. q_proj rows are num_heads * head_dim and k/v rows
# num_kv_heads * head_dim, so an even split gives each rank whole heads.
SPLITS = {
    "self_attn.q_proj.weight": 0, "self_attn.q_proj.bias": 0, "self_attn.k_proj.weight": 0,
    "self_attn.k_proj.bias": 0, "self_attn.v_proj.weight": 0, "self_attn.v_proj.bias": 0,
    "mlp.gate_proj.weight": 0, "mlp.up_proj.weight": 0,
    "self_attn.o_proj.weight": 1, "mlp.down_proj.weight": 1,
    "embed_tokens.weight": 0, "lm_head.weight": 0,
}


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group; ``group`` is the torch.distributed group to reduce over."""

    rank: int
    size: int
    group: Any = None  # torch.distributed.ProcessGroup (None: the default group)

    def shard_arch(self, arch: ArchConfig) -> ArchConfig:
        """The architecture of one rank's shard: its heads, KV heads, MLP columns and vocabulary rows."""
        return dataclasses.replace(arch, num_heads=arch.num_heads // self.size,
                                   num_kv_heads=arch.num_kv_heads // self.size,
                                   intermediate_size=arch.intermediate_size // self.size,
                                   vocab_size=arch.vocab_size // self.size)

    def slice_of(self, name: str, shape: list[int]) -> tuple[slice, ...] | None:
        """The index of this rank's part of the HF weight ``name`` (of ``shape``); None: it holds all of it."""
        dim = next((d for suffix, d in SPLITS.items() if name.endswith(suffix)), None)
        if dim is None:
            return None
        part = shape[dim] // self.size
        index = [slice(None)] * len(shape)
        index[dim] = slice(self.rank * part, (self.rank + 1) * part)
        return tuple(index)


class AllReduceOutput(nn.Module):
    """A row-parallel linear: ``linear(x)`` summed over the tensor-parallel group (its bias, if any, would be
    added ``size`` times: the Llama family's row-parallel projections have none)."""

    def __init__(self, linear: nn.Module, group: Any):
        super().__init__()
        self.linear, self.group = linear, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        torch.distributed.all_reduce(out, group=self.group)
        return out


def reduce_row_parallel(model: LlamaForCausalLM, tp: TensorParallel) -> None:
    """Wrap each layer's o_proj and down_proj in an all-reduce over ``tp.group``, in place: one after attention,
    one after the MLP."""
    for layer in model.layers:
        if layer.self_attn.o_proj.bias is not None or layer.mlp.down_proj.bias is not None:
            raise ValueError("tensor parallelism needs o_proj and down_proj without a bias")
        layer.self_attn.o_proj = AllReduceOutput(layer.self_attn.o_proj, tp.group)
        layer.mlp.down_proj = AllReduceOutput(layer.mlp.down_proj, tp.group)


class VocabParallelEmbedding(nn.Module):
    """This rank's vocabulary rows of the embedding: other ids embed as zeros, and the all-reduce over the
    group puts each token's row, from the rank that holds it, in every rank's output."""

    def __init__(self, embedding: nn.Embedding, start: int, group: Any):
        super().__init__()
        self.embedding, self.start, self.group = embedding, start, group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.embedding.num_embeddings)
        x = self.embedding(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0)
        torch.distributed.all_reduce(x, group=self.group)
        return x


class GatherLogits(nn.Module):
    """This rank's vocabulary slice of the LM head; the all-gather over the group gives every rank the whole
    row of logits, in vocabulary order (rank r holds slice r)."""

    def __init__(self, lm_head: nn.Module, size: int, group: Any):
        super().__init__()
        self.lm_head, self.size, self.group = lm_head, size, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.lm_head(x).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        torch.distributed.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1)


def split_vocab(model: LlamaForCausalLM, tp: TensorParallel) -> None:
    """Make ``model``'s embedding and LM head (loaded with this rank's vocabulary rows) vocab-parallel, in place."""
    rows = model.cfg.vocab_size  # this rank's
    if model.stage.first:  # a pipeline's later stages have no embedding, its earlier ones no LM head
        model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, tp.rank * rows, tp.group)
    if model.stage.last:
        model.lm_head = GatherLogits(model.lm_head, tp.size, tp.group)
