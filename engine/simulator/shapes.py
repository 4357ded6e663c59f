"""Transformer shapes of the models the simulator studies, from each model's HF ``config.json``.

Only what the cost model and the memory planner need: layer count, widths, heads and vocabulary.
``PROFILED`` names the shapes whose operators the vendored GPU profiles measured (their file stem).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True            # SwiGLU (Llama) vs a plain GELU MLP (Falcon)
    parallel_attn_mlp: bool = False   # Falcon: attention and MLP read the same normed input
    tied_embeddings: bool = False     # the LM head reuses the embedding matrix

    def layer_params(self) -> int:
        """Weights of one transformer layer's linear operators (norm weights are negligible)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size + mlp

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size
        return (self.num_layers * self.layer_params() + embeddings) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _shape(name, layers, hidden, heads, kv_heads, ffn, vocab, head_dim=128, **kw) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, **kw)


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    _shape("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
    _shape("yi-34b", 60, 7168, 56, 8, 20480, 64000),
    _shape("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    _shape("falcon-180b", 80, 14848, 232, 8, 4 * 14848, 65024, head_dim=64, gated_mlp=False,
           parallel_attn_mlp=True, tied_embeddings=True),
    _shape("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    # the profiled models (Vidur's profiles; Qwen-72B's FFN is per branch, half its config's intermediate_size)
    _shape("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    _shape("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    _shape("codellama-34b", 48, 8192, 64, 8, 22016, 32000),
    _shape("qwen-72b", 80, 8192, 64, 64, 24576, 152064),
    _shape("internlm-20b", 60, 5120, 40, 40, 13824, 103168),
    _shape("phi-2", 32, 2560, 32, 32, 10240, 51200, head_dim=80, gated_mlp=False, parallel_attn_mlp=True),
)}

PROFILED: dict[str, str] = {
    "llama2-7b": "Llama-2-7b-hf", "llama2-70b": "Llama-2-70b-hf", "llama3-8b": "Meta-Llama-3-8B",
    "llama3-70b": "Meta-Llama-3-70B", "codellama-34b": "CodeLlama-34b-Instruct-hf", "qwen-72b": "Qwen-72B",
    "internlm-20b": "internlm-20b", "phi-2": "phi-2",
}
