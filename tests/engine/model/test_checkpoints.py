"""Checkpoints that load or say why: tokenizer-less directories, tokenizer= / skip_tokenizer_init, and
broken files that each give one ValueError line naming the file."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.server import main

ENGINE = {"dtype": "float32", "num_blocks": 64}
WEIGHTS = "model.safetensors"


def checkpoint(tmp_path: Path, with_tokenizer: bool = True) -> Path:
    """A copy of the tiny preset's directory (its weights, config and, optionally, its tokenizer)."""
    tiny = resolve_model_path("tiny")
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in tiny.iterdir():
        if with_tokenizer or f.name in ("config.json", "generation_config.json", WEIGHTS):
            shutil.copy(f, out / f.name)
    return out


def generate(engine: LLMEngine, prompt: str | list[int]) -> tuple[list[int], str]:
    engine.add_request(prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), request_id="r")
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                return out.token_ids, out.text
    raise AssertionError("no output")


# -- tokenizers ------------------------------------------------------------------------------------


def test_checkpoint_without_tokenizer_serves_token_ids(tmp_path):
    path = checkpoint(tmp_path, with_tokenizer=False)
    engine = LLMEngine.from_kwargs(model=str(path), **ENGINE)
    assert engine.tokenizer is None
    ids, text = generate(engine, [5, 6, 7])
    assert len(ids) == 3 and text == ""
    with pytest.raises(ValueError, match="text prompts need a tokenizer") as err:
        engine.add_request("hello")
    assert str(path) in str(err.value) and "tokenizer.json" in str(err.value)


def test_tokenizer_option_and_skip_tokenizer_init(tmp_path):
    path = checkpoint(tmp_path, with_tokenizer=False)
    with_preset = LLMEngine.from_kwargs(model=str(path), tokenizer="tiny", **ENGINE)
    reference = LLMEngine.from_kwargs(model="tiny", **ENGINE)
    assert generate(with_preset, "the quick fox") == generate(reference, "the quick fox")
    skipped = LLMEngine.from_kwargs(model="tiny", skip_tokenizer_init=True, **ENGINE)
    assert skipped.tokenizer is None and generate(skipped, [5, 6])[1] == ""
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        skipped.add_request("hello")


def test_tokenizer_directory_without_files_is_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no tokenizer files") as err:
        LLMEngine.from_kwargs(model="tiny", tokenizer=str(empty), **ENGINE)
    assert str(empty) in str(err.value)


def test_lone_surrogate_prompt_is_a_value_error():
    engine = LLMEngine.from_kwargs(model="tiny", **ENGINE)
    with pytest.raises(ValueError, match="surrogate at index 1"):
        engine.add_request("a\ud800b")


# -- broken checkpoints ----------------------------------------------------------------------------


def _edit_config(**changes) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(cfg | changes))
    return edit


def _truncate_weights(path: Path) -> None:
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(data[: len(data) // 2])


def _drop_tensor(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / WEIGHTS))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(path / WEIGHTS))


BROKEN = [
    # (what is broken, the file the message names, a phrase of the message)
    (lambda p: (p / WEIGHTS).write_bytes(b"\x00" * 64), WEIGHTS, "not a readable safetensors file"),
    (_truncate_weights, WEIGHTS, "not a readable safetensors file"),
    (lambda p: (p / "config.json").write_text('{"architectures": ['), "config.json", "not valid JSON"),
    (lambda p: (p / "config.json").write_text("[1, 2]"), "config.json", "expected a JSON object"),
    (_edit_config(hidden_size=None), "config.json", "hidden_size must be an integer >= 1"),
    (_edit_config(intermediate_size=512), "config.json", "mlp.gate_up_proj.weight has shape"),
    (_edit_config(num_key_value_heads=4), "config.json", "qkv_proj.weight has shape"),
    (_edit_config(vocab_size=4096), "config.json", "has shape"),
    (_drop_tensor, WEIGHTS, "missing ['layers.1.mlp.down_proj.weight']"),
    (lambda p: (p / "tokenizer.json").write_text("{not json"), "ckpt", "cannot load the tokenizer"),
]


@pytest.mark.parametrize("breakage, named_file, phrase", BROKEN)
def test_broken_checkpoint_is_one_line_naming_the_file(tmp_path, breakage, named_file, phrase):
    path = checkpoint(tmp_path)
    breakage(path)
    with pytest.raises(ValueError) as err:
        LLMEngine.from_kwargs(model=str(path), **ENGINE)
    message = str(err.value)
    assert str(path / named_file if named_file != "ckpt" else path) in message and phrase in message
    assert "\n" not in message


def test_serve_reports_a_broken_checkpoint_in_one_line(tmp_path, capsys):
    path = checkpoint(tmp_path)
    _truncate_weights(path)
    assert main(["model=path", f"model.model={path}", "port=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path / WEIGHTS}: not a readable safetensors file" in err
