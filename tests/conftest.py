import os
import shutil
from pathlib import Path

import pytest

# Presets are materialized once per machine; tests share the user's cache unless told otherwise.
os.environ.setdefault("STALLFREE_CACHE", str(Path.home() / ".cache" / "stallfree"))
# Torch imports triton.language by itself (at its own import, or at the first tensor made under a device
# mode) where triton is installed, and only a triton.language imported under the interpreter can run the
# kernel tests on a CPU. So on a machine with no NVIDIA device the interpreter is chosen here, before any
# test imports torch; with a GPU nothing changes and the kernels are compiled (tests/engine/conftest.py).
if not any(Path("/dev").glob("nvidia[0-9]*")):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slow" in item.keywords and os.environ.get("STALLFREE_SKIP_SLOW"):
            item.add_marker(pytest.mark.skip(reason="STALLFREE_SKIP_SLOW set"))


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    from stallfree.engine.model.presets import resolve_model_path
    return resolve_model_path("tiny")


def save_random_hf_model(model_cls, config, path: Path, tokenizer_src: Path, seed: int = 0) -> Path:
    """Random weights scaled so greedy outputs vary (transformers' default init repeats one token)."""
    import torch
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "embed" in name:
                p.normal_(0, 1.0)
            else:
                p.normal_(0, p.shape[1] ** -0.5)
    model.save_pretrained(path, safe_serialization=True)
    for f in tokenizer_src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def arch_paths(tmp_path_factory, tiny_path) -> dict[str, Path]:
    """The tiny Llama preset, a Mistral-style GQA model and a Qwen2-style model with qkv bias (tied)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
    root = tmp_path_factory.mktemp("archs")
    common = dict(vocab_size=2048, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
                  bos_token_id=1, eos_token_id=2)
    mistral = MistralConfig(**common, sliding_window=None, rope_theta=1e4)
    qwen = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
    return {
        "llama": tiny_path,
        "mistral": save_random_hf_model(MistralForCausalLM, mistral, root / "mistral", tiny_path, seed=1),
        "qwen2": save_random_hf_model(Qwen2ForCausalLM, qwen, root / "qwen2", tiny_path, seed=2),
    }
