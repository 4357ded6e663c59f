"""What one iteration computes and moves, counted from the model's shapes: the numerators of MFU and MBU.

* Model FLOPs: the linear layers, 2 x weights x tokens (lm_head only for the rows that sample), plus
  attention, 4 x layers x heads x head_dim per query-key pair (QK^T and PV). A prefill chunk of c new tokens
  after p cached ones has c x p + c (c + 1) / 2 causal pairs; a decode has its context length (its new token
  included). Norms, rotary, activations and sampling are left out (a few percent).
* Bytes moved, the traffic to memory: the linear layers' weights, read once per iteration; K and V of the
  tokens each sequence had cached before the iteration, read once (per KV head: the query heads of a group
  share them); K and V of every new token, written once. A new token's own K and V are read right after
  they are written, from the cache, and are not counted again; nor are the activations (a chunk's hidden
  states stay in the caches of the layer that uses them).

MFU = FLOPs / (iteration seconds x peak FLOP/s); MBU = bytes / (iteration seconds x bandwidth) (docs/engine.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stallfree.engine.model.arch import ArchConfig


@dataclass(frozen=True)
class IterationWork:
    flops: float
    bytes_moved: float


@dataclass(frozen=True)
class ModelCounts:
    layer_linear_params: int  # every decoder layer's projections, all layers
    lm_head_params: int
    attention_flops_per_pair: int  # all layers, per query-key pair
    kv_bytes_per_token: int  # K and V, all layers
    weight_bytes: int  # the linear layers, lm_head included

    @classmethod
    def of(cls, arch: ArchConfig, dtype_bytes: int, weight_itemsize: int | None = None) -> ModelCounts:
        """``weight_itemsize``: bytes per linear weight, where the weights are stored narrower than ``dtype_bytes``."""
        q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        h = arch.hidden_size
        layer = h * (q + 2 * kv) + q * h + 3 * h * arch.intermediate_size
        lm_head = arch.vocab_size * h
        return cls(layer_linear_params=arch.num_layers * layer, lm_head_params=lm_head,
                   attention_flops_per_pair=4 * arch.num_layers * q,
                   kv_bytes_per_token=2 * arch.num_layers * kv * dtype_bytes,
                   weight_bytes=(arch.num_layers * layer + lm_head) * (weight_itemsize or dtype_bytes))

    def work(self, units: Sequence) -> IterationWork:
        """The work of an iteration's ``ScheduledUnit``s, decodes first (anything with ``num_new_tokens``,
        ``num_computed_tokens``, ``is_prefill`` and ``samples``). Decodes are summed in one pass (a decode is
        one new token that samples, over its context): this runs every iteration."""
        decodes = len(units)
        while decodes and units[decodes - 1].is_prefill:
            decodes -= 1
        kv_read = sum(u.num_computed_tokens for u in units[:decodes])
        tokens = sampled = decodes
        pairs = kv_read + decodes
        for u in units[decodes:]:
            new, cached = u.num_new_tokens, u.num_computed_tokens
            tokens += new
            sampled += u.samples
            pairs += new * cached + new * (new + 1) // 2
            kv_read += cached
        flops = 2 * (self.layer_linear_params * tokens + self.lm_head_params * sampled) \
            + self.attention_flops_per_pair * pairs
        return IterationWork(float(flops), float(self.weight_bytes + self.kv_bytes_per_token * (kv_read + tokens)))
