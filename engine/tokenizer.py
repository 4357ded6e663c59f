"""Tokenizer loading (optional: checkpoints without tokenizer files serve token-id prompts) and the text
check every tokenizer needs."""
from __future__ import annotations

import logging
from pathlib import Path

from stallfree.engine.model.presets import resolve_model_path

# Any of these makes a directory a tokenizer source for AutoTokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

logger = logging.getLogger("stallfree.engine")


def first_lone_surrogate(text: str) -> int | None:
    """Index of the first unpaired UTF-16 surrogate (JSON "\\ud800" decodes to one), which no tokenizer
    accepts; None if the text is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def prompt_token_ids(prompt: str | list[int], tokenizer: object | None, no_tokenizer_reason: str) -> list[int]:
    """A prompt's token ids: a text prompt encoded, ValueError where it cannot be (no tokenizer, bad Unicode)."""
    if not isinstance(prompt, str):
        return list(prompt)
    if tokenizer is None:
        raise ValueError(f"text prompts need a tokenizer: {no_tokenizer_reason}")
    if (surrogate := first_lone_surrogate(prompt)) is not None:
        raise ValueError(f"prompt has a lone UTF-16 surrogate at index {surrogate} (not valid Unicode)")
    return tokenizer.encode(prompt)


def load_tokenizer(model_dir: Path, tokenizer: str | None, skip_tokenizer_init: bool) -> tuple[object | None, str]:
    """(the tokenizer, or None and why there is none). ``tokenizer`` (a directory or preset) replaces the
    model directory's own; a model directory without tokenizer files loads without one (token-id
    prompts only). Raises ValueError naming the directory when tokenizer files are there but broken."""
    if skip_tokenizer_init:
        return None, "the engine was started with skip_tokenizer_init"
    source = resolve_model_path(tokenizer) if tokenizer else model_dir
    expected = ", ".join(TOKENIZER_FILES)
    if not any((source / name).is_file() for name in TOKENIZER_FILES):
        if tokenizer:
            raise ValueError(f"tokenizer {str(source)!r} has no tokenizer files (expected one of {expected})")
        logger.warning("%s has no tokenizer files: serving token-id prompts only", source)
        return None, (f"{source} has no tokenizer files (expected one of {expected}); send token ids, "
                      "or set tokenizer=DIR")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(source), ""
    except Exception as exc:  # transformers raises many types; none names the directory
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{source}: cannot load the tokenizer ({type(exc).__name__}: {reason})") from None
