"""Text workloads read from local files: each request is a text prompt (or chat messages) whose tokens
are counted with the target model's tokenizer.

* ``sharegpt``: a ShareGPT-format JSON list; a conversation's first turn is the prompt and the next
  turn's token count is the output length (as vLLM's ``sharegpt`` dataset);
* ``jsonl``: one ``{"prompt": str}`` or ``{"messages": [...]}`` object per line, with ``max_tokens``;
* ``sonnet``: prompts of about ``input_len`` tokens cut from the bundled Shakespeare sonnets, a shared
  prefix of the first lines plus randomly drawn lines (as vLLM's ``sonnet`` dataset).

``LengthTexts`` gives a workload of lengths only text prompts of its exact token counts, for servers that
take text alone (loadgen.workload.request_specs.with_text_prompts).

Each kind is a function ``(rng, tokenizer, **settings)`` yielding TextRequests in the order they are
taken; loadgen.workload.request_specs keeps the first ``num_requests`` that fit ``max_total_tokens``.
"""
from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from stallfree.engine.config_checks import ConfigError, is_int, require

TEXTS_DIR = Path(__file__).parent / "texts"
SONNET_INSTRUCTION = "Pick as many lines as you can from these poem lines:\n"
MAX_CANDIDATES_PER_REQUEST = 50
LENGTH_ATTEMPTS = 4  # re-cuts of a text prompt whose decoded window counts other than the length asked


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass
class TextRequest:
    prompt: str | None
    messages: list[dict] | None
    prompt_token_ids: list[int]
    max_tokens: int


@functools.cache
def load_tokenizer(path: str) -> Tokenizer:
    """The Hugging Face tokenizer in ``path`` (transformers is imported on use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def chat_token_ids(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    """The prompt tokens of a chat request as an OpenAI-compatible server renders it: the chat template
    with the generation prompt when the tokenizer has one, else the contents one after another."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode("\n".join(str(m.get("content", "")) for m in messages))


def _text_request(tokenizer: Tokenizer, entry: dict, max_tokens: int) -> TextRequest:
    if "messages" in entry:
        return TextRequest(None, entry["messages"], chat_token_ids(tokenizer, entry["messages"]), max_tokens)
    return TextRequest(entry["prompt"], None, tokenizer.encode(entry["prompt"]), max_tokens)


def _file(path: str, key: str = "lengths.path") -> Path:
    file = Path(path).expanduser()
    require(file.is_file(), key, "an existing file", path)
    return file


@functools.cache
def _read_json(path: Path) -> list:
    return json.loads(path.read_text())


def _order(rng: np.random.Generator, n: int, shuffle: bool) -> np.ndarray:
    return rng.permutation(n) if shuffle else np.arange(n)


def sharegpt(rng: np.random.Generator, tokenizer: Tokenizer, path: str, shuffle: bool = True,
             output_len: int | None = None) -> Iterator[TextRequest]:
    """Conversations with at least two turns: the first turn's text is the prompt, the second turn's
    token count the output length (``output_len`` fixes it instead)."""
    data = _read_json(_file(path))
    require(isinstance(data, list), "lengths.path", "a ShareGPT JSON list of conversations", path)
    usable = [c["conversations"] for c in data if len(c.get("conversations", [])) >= 2]
    for i in _order(rng, len(usable), shuffle):
        prompt, reply = usable[i][0]["value"], usable[i][1]["value"]
        out = output_len or len(tokenizer.encode(reply, add_special_tokens=False))
        yield TextRequest(prompt, None, tokenizer.encode(prompt), out)


def jsonl(rng: np.random.Generator, tokenizer: Tokenizer, path: str, shuffle: bool = False) -> Iterator[TextRequest]:
    """One request per line: ``{"prompt": str | "messages": [...], "max_tokens": int}``."""
    lines = [line for line in _file(path).read_text().splitlines() if line.strip()]
    for i in _order(rng, len(lines), shuffle):
        entry = json.loads(lines[i])
        where = f"{path} line {i + 1}"
        require(("prompt" in entry) != ("messages" in entry), "lengths.path",
                "lines with exactly one of prompt / messages", where)
        require(is_int(entry.get("max_tokens")) and entry["max_tokens"] >= 1, "lengths.path",
                "lines with an integer max_tokens >= 1", where)
        yield _text_request(tokenizer, entry, entry["max_tokens"])


def sonnet(rng: np.random.Generator, tokenizer: Tokenizer, input_len: int = 550, prefix_len: int = 200,
           output_len: int = 150, path: str = str(TEXTS_DIR / "sonnets.txt")) -> Iterator[TextRequest]:
    """The instruction, the first lines worth about ``prefix_len`` tokens (shared by every request) and
    random lines up to about ``input_len`` tokens; line counts come from the mean tokens per line."""
    for key, value in (("input_len", input_len), ("prefix_len", prefix_len), ("output_len", output_len)):
        require(is_int(value) and value >= 1, f"lengths.{key}", "an integer >= 1", value)
    require(prefix_len <= input_len, "lengths.prefix_len", f"<= input_len ({input_len})", prefix_len)
    lines = [line + "\n" for line in _file(path).read_text().splitlines() if line.strip()]
    per_line = np.mean([len(tokenizer.encode(line, add_special_tokens=False)) for line in lines])
    base = len(tokenizer.encode(SONNET_INSTRUCTION))
    num_prefix = max(0, round((prefix_len - base) / per_line))
    num_input = max(num_prefix, round((input_len - base) / per_line))
    prefix = "".join(lines[:num_prefix])
    while True:
        drawn = rng.choice(len(lines), size=num_input - num_prefix)
        prompt = SONNET_INSTRUCTION + prefix + "".join(lines[i] for i in drawn)
        yield TextRequest(prompt, None, tokenizer.encode(prompt), output_len)


class LengthTexts:
    """Text prompts of a given token count: a window of the bundled sonnets' tokens (read cyclically)
    decoded to text. A decoded window can count differently once encoded again (tokens merge across
    the cut, the special tokens the encoder adds), so it is cut again by the difference, up to
    LENGTH_ATTEMPTS times; ``prompt`` returns the text and its final encoding, whose length is the
    request's prompt length (the server's own count lands in the run's requests as its usage says)."""

    def __init__(self, tokenizer: Tokenizer, path: Path = TEXTS_DIR / "sonnets.txt"):
        self.tokenizer = tokenizer
        self.corpus = np.asarray(tokenizer.encode(path.read_text(), add_special_tokens=False))
        self.special = len(tokenizer.encode("a")) - len(tokenizer.encode("a", add_special_tokens=False))

    def _window(self, start: int, size: int) -> list[int]:
        return np.take(self.corpus, np.arange(start, start + size), mode="wrap").tolist()

    def prompt(self, length: int, start: int) -> tuple[str, list[int]]:
        """A text of ``length`` tokens (as exact as LENGTH_ATTEMPTS cuts make it) from corpus token ``start``."""
        size = max(1, length - self.special)
        for _ in range(LENGTH_ATTEMPTS):
            text = self.tokenizer.decode(self._window(start, size))
            ids = self.tokenizer.encode(text)
            if len(ids) == length:
                break
            size = max(1, size + length - len(ids))
        return text, ids


TEXT_WORKLOADS: dict[str, Callable[..., Iterator[TextRequest]]] = {
    "sharegpt": sharegpt, "jsonl": jsonl, "sonnet": sonnet,
}


def take(requests: Iterator[TextRequest], n: int, max_total_tokens: int | None) -> list[TextRequest]:
    """The first n requests whose prompt + output fits max_total_tokens (text cannot be clipped),
    looking at no more than MAX_CANDIDATES_PER_REQUEST x n of them (``sonnet`` never runs out)."""
    kept = []
    for request in itertools.islice(requests, MAX_CANDIDATES_PER_REQUEST * n):
        if max_total_tokens is None or len(request.prompt_token_ids) + request.max_tokens <= max_total_tokens:
            kept.append(request)
            if len(kept) == n:
                return kept
    raise ConfigError(f"num_requests must be <= the {len(kept)} requests of the text workload that fit "
                      f"max_total_tokens={max_total_tokens} (of the first {MAX_CANDIDATES_PER_REQUEST * n}), "
                      f"got {n}")
