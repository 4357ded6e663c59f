"""Architecture description parsed from an HF ``config.json`` (Llama 2/3, Mistral, Qwen2)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    qkv_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None
    eos_token_ids: list[int]

    @classmethod
    def from_dir(cls, path: Path) -> ArchConfig:
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ValueError(f"{path} is not an HF checkpoint directory: config.json is missing")
        try:
            cfg = json.loads(config_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{config_file}: not valid JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{config_file}: expected a JSON object, got {type(cfg).__name__}")
        return cls.from_dict(cfg, source=str(config_file))

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config") -> ArchConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"{source}: unsupported or missing architecture {archs!r}; "
                             f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: unsupported hidden_act {cfg['hidden_act']!r} (only silu)")
        # transformers >= 5 writes rope settings under rope_parameters; older versions use rope_theta/rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3"):
            raise ValueError(f"{source}: unsupported rope scaling type {rope_type!r}")
        for key in REQUIRED_SIZES:
            value = cfg.get(key)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{source}: {key} must be an integer >= 1, got {value!r}")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", arch == "MistralForCausalLM") else None
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            sliding_window=sliding,
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )
