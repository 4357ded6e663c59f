"""Convert a llama.cpp GGUF checkpoint (Llama architecture, byte-level BPE vocabulary) into an HF-format
directory: ``config.json``, ``model.safetensors`` (dequantized to fp32) and the tokenizer files.

Needs the ``gguf`` package (pure Python + numpy). The mapping follows transformers' own GGUF loader
(``modeling_gguf_pytorch_utils``, ``integrations/gguf``): tensor names, the Q/K row permutation that
llama.cpp's converter applies (undone here), and the tokenizer rebuilt from the vocabulary, merges,
token types, special token ids and chat template stored as metadata.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

# llama.cpp tensor names -> HF Llama names (per layer: blk.<i>.<name>.weight -> model.layers.<i>.<name>.weight)
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
CONTROL_TOKEN = 3  # llama.cpp token type of special tokens such as <|im_start|>
# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> whether digits split one by one before the GPT-2 regex
DIGIT_SPLITS = {"gpt2": False, "smollm": True}


def open_gguf(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError(f"converting {path} needs the gguf package: pip install gguf") from None
    return GGUFReader(path)


def metadata(reader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def hf_config(reader) -> dict:
    arch = metadata(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only llama)")
    names = {t.name for t in reader.tensors}
    heads = metadata(reader, "llama.attention.head_count")
    tokens = metadata(reader, "tokenizer.ggml.tokens")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": metadata(reader, "llama.embedding_length"),
        "intermediate_size": metadata(reader, "llama.feed_forward_length"),
        "num_hidden_layers": metadata(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": metadata(reader, "llama.attention.head_count_kv", heads),
        "vocab_size": metadata(reader, "llama.vocab_size", len(tokens)),
        "max_position_embeddings": metadata(reader, "llama.context_length"),
        "rms_norm_eps": metadata(reader, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": metadata(reader, "llama.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": metadata(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def hf_name(gguf_name: str) -> str:
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name):
        if m[2] in LAYER_NAMES:
            return f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}.weight"
    elif (stem := gguf_name.removesuffix(".weight")) in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.weight"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")


def unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of q/k rows (per head, its two rotary halves interleaved)."""
    head_dim = weight.shape[0] // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def read_weights(reader, cfg: dict) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        values = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # a writable copy
        kind = tensor.name.split(".")[-2]
        if kind in heads:
            values = unpermute(values, heads[kind])
        weights[hf_name(tensor.name)] = torch.from_numpy(values)
    return weights


def build_tokenizer(reader):
    """A PreTrainedTokenizerFast from the byte-level BPE that the metadata describes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind, pre = metadata(reader, "tokenizer.ggml.model"), metadata(reader, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in DIGIT_SPLITS or metadata(reader, "tokenizer.ggml.add_bos_token", False):
        raise ValueError(f"GGUF tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported (only "
                         f"byte-level BPE 'gpt2' with {sorted(DIGIT_SPLITS)}, adding no BOS token)")
    tokens = metadata(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in metadata(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    splits = [pre_tokenizers.Digits(individual_digits=True)] if DIGIT_SPLITS[pre] else []
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    types = metadata(reader, "tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == CONTROL_TOKEN])

    def token(key: str) -> str | None:
        index = metadata(reader, f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[index]

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=token("bos"), eos_token=token("eos"), unk_token=token("unknown"),
        pad_token=token("padding"), chat_template=metadata(reader, "tokenizer.chat_template"))


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the HF-format directory of ``gguf_path`` into ``out_dir`` (created)."""
    reader = open_gguf(gguf_path)
    cfg = hf_config(reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    generation = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg[k] is not None}
    (out_dir / "generation_config.json").write_text(json.dumps(generation))
    save_file(read_weights(reader, cfg), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(reader).save_pretrained(out_dir)
