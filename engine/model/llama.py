"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a flat token batch and a paged KV cache."""
from __future__ import annotations

import math

import torch
from torch import nn

from stallfree.engine.attention import AttentionMetadata
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.stages import PipelineStage

Hidden = tuple[torch.Tensor, torch.Tensor]  # a stage's output: (last layer's output, residual stream before it)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x), or with ``residual``: (norm(x + residual), x + residual), the sum being the next residual."""
        if residual is None:
            return self.normalize(x)
        residual = x + residual
        return self.normalize(residual), residual

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 and scale in the model dtype, like transformers, so bf16 outputs match.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by factor, interpolate smoothly in between.
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: ArchConfig, max_len: int):
        super().__init__()
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``positions`` as [T, 1, D], looked up once per forward pass for all layers."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


class ApplyRotary(nn.Module):
    """Rotates Q and K by their positions' angles (the rotate-half form of Llama and transformers)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        cos, sin = cos_sin
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class SiluAndMul(nn.Module):
    """silu(gate) * up for the fused gate_up projection's output ``[gate | up]``."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.rotary = ApplyRotary()

    def forward(self, x, cos_sin, attn_backend, kv_cache, meta: AttentionMetadata):
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(q, k, cos_sin)
        return self.o_proj(attn_backend(q, k, v, kv_cache[0], kv_cache[1], meta))


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, cos_sin, attn_backend, kv_cache, meta):
        """Returns (this layer's output, the residual stream before it): the add that joins them is done
        by the next norm, where it fuses (vLLM's layout)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, cos_sin, attn_backend, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """The decoder, or with ``stage`` one pipeline stage of it (engine/model/stages.py): its layers only, the
    embedding on the first stage, the final norm and LM head on the last."""

    def __init__(self, cfg: ArchConfig, max_len: int, stage: PipelineStage | None = None):
        super().__init__()
        self.cfg = cfg
        self.stage = stage or PipelineStage.whole(cfg.num_layers)
        if self.stage.first:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in self.stage.layers)
        if self.stage.last:
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.tie_word_embeddings and self.stage.first:
                self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids, positions, attn_backend, kv_caches, meta: AttentionMetadata,
                logits_indices: torch.Tensor, hidden: Hidden | None = None) -> torch.Tensor:
        """Run the flat batch (the last stage: from the previous stage's ``hidden``); return fp32 logits of the
        rows in ``logits_indices``."""
        x, residual = self.hidden_states(input_ids, positions, attn_backend, kv_caches, meta, hidden)
        if logits_indices.numel() == 0:  # a partial prefill chunk samples nothing
            return x.new_empty(0, self.cfg.vocab_size, dtype=torch.float32)
        x, _ = self.norm(x[logits_indices], residual[logits_indices])
        return self.lm_head(x).float()

    def hidden_states(self, input_ids, positions, attn_backend, kv_caches, meta: AttentionMetadata,
                      hidden: Hidden | None = None) -> Hidden:
        """This stage's layers over the embedded ``input_ids`` (first stage) or the previous stage's ``hidden``:
        (the last layer's output, the residual stream before it), what the next stage takes."""
        x, residual = (self.embed_tokens(input_ids), None) if hidden is None else hidden
        return self.run_layers(x, self.rotary(positions, x.dtype), attn_backend, kv_caches, meta, residual)

    def run_layers(self, x, cos_sin, attn_backend, kv_caches, meta: AttentionMetadata,
                   residual: torch.Tensor | None = None) -> Hidden:
        """The decoder layers over ``x`` (and the ``residual`` stream, from a previous stage): (the last layer's
        output, the residual stream before it)."""
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, cos_sin, attn_backend, kv_cache, meta)
        return x, residual
