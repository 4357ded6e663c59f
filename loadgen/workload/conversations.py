"""Multi-turn sessions from conversation files (``lengths.kind: sharegpt_sessions``): the real turns of each
conversation, as vLLM's multi-turn benchmark and GuideLLM replay them. Turn k's request is the chat messages up to
the k-th user message, the conversation's own earlier answers among them, and its output length is the token count
of the k-th answer (``output_len`` fixes it); sent as messages on ``target.endpoint=chat``, as the chat template's
token ids otherwise (loadgen.workload.text_prompts.chat_token_ids).

A file is a ShareGPT JSON list (``{"conversations": [{"from": "human" | "gpt" | "system", "value": str}]}``) or
JSONL of such objects or of ``{"messages": [{"role": "user" | "assistant" | "system", "content": str}]}``.
A record that is not one of these is one error naming the file, the record and what is wrong; a conversation
whose turns do not alternate user / assistant (after an optional system message) is skipped, as vLLM skips them.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from stallfree.engine.config_checks import ConfigError, is_int, is_number, require
from stallfree.loadgen.workload.sessions import Session, Turn
from stallfree.loadgen.workload.text_prompts import Tokenizer, chat_token_ids

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}


def _parsed(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"lengths.path: {where} is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _records(file: Path) -> list[tuple[str, object]]:
    """(where, record) of each conversation in a JSON list or a JSONL file."""
    text = file.read_text()
    if file.suffix == ".jsonl":
        return [(f"{file} line {i}", _parsed(line, f"{file} line {i}")) for i, line in enumerate(text.splitlines(), 1)
                if line.strip()]
    data = _parsed(text, str(file))
    if not isinstance(data, list):
        raise ConfigError(f"lengths.path: {file} is not a JSON list of conversations (or a .jsonl file of them)")
    return [(f"{file} record {i}", record) for i, record in enumerate(data)]


def _messages(where: str, record: object) -> list[dict]:
    """A record's messages as OpenAI chat messages; ConfigError naming the record when it is malformed."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"lengths.path: {where}: {what}")

    if not isinstance(record, dict) or not isinstance(record.get("conversations", record.get("messages")), list):
        raise bad('not an object with a "conversations" or "messages" list')
    turns, (role_key, text_key) = ((record["conversations"], ("from", "value")) if "conversations" in record
                                   else (record["messages"], ("role", "content")))
    messages = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get(text_key), str) or turn.get(role_key) not in ROLES:
            raise bad(f'turn {k} is not {{"{role_key}": one of {sorted(ROLES)}, "{text_key}": a string}}')
        messages.append({"role": ROLES[turn[role_key]], "content": turn[text_key]})
    return messages


def _alternates(messages: list[dict]) -> bool:
    talk = messages[1:] if messages and messages[0]["role"] == "system" else messages
    return len(talk) >= 2 and all(m["role"] == ("user" if k % 2 == 0 else "assistant") for k, m in enumerate(talk))


def sharegpt_sessions(rng: np.random.Generator, tokenizer: Tokenizer, path: str, shuffle: bool = True,
                      output_len: int | None = None, think_time_s: float = 2.0) -> Iterator[Session]:
    """The conversations of ``path`` as sessions, in a seeded order (``shuffle``) or the file's, a turn per user
    message that has an answer; think times exponential with mean ``think_time_s`` (0: none)."""
    require(output_len is None or (is_int(output_len) and output_len >= 1), "lengths.output_len",
            "an integer >= 1 or null", output_len)
    require(is_number(think_time_s) and think_time_s >= 0, "lengths.think_time_s", "a number >= 0", think_time_s)
    file = Path(path).expanduser()
    require(file.is_file(), "lengths.path", "an existing file", path)
    conversations = [messages for messages in (_messages(where, record) for where, record in _records(file))
                     if _alternates(messages)]
    require(bool(conversations), "lengths.path", "a file with a conversation of alternating user / assistant turns",
            path)
    order = rng.permutation(len(conversations)) if shuffle else np.arange(len(conversations))
    for i in order:
        messages = conversations[i]
        first_user = 1 if messages[0]["role"] == "system" else 0
        session = []
        for k in range(first_user, len(messages) - 1, 2):
            answer = messages[k + 1]["content"]
            think = float(rng.exponential(think_time_s)) if session and think_time_s > 0 else 0.0
            out = output_len or max(1, len(tokenizer.encode(answer, add_special_tokens=False)))
            session.append(Turn(chat_token_ids(tokenizer, messages[:k + 1]), out, think, messages[:k + 1]))
        yield session
