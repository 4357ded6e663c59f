"""Per-token text for streaming: incremental detokenization and stop strings on the decoded text."""
from __future__ import annotations

# Prompt tokens decoded before the first output token, so it gets the spacing it has mid-sequence
# (SentencePiece-style tokenizers drop a leading space when a token is decoded on its own).
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """vLLM-style sliding-window decode: O(window) per token, and a token that ends in the middle of a
    UTF-8 sequence (byte-level BPE) yields no text until the character is complete."""

    def __init__(self, tokenizer, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _pending_text(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        return full[len(prefix):] if len(full) > len(prefix) else ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be empty)."""
        self.ids.append(token_id)
        text = self._pending_text()
        if not text or text.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character decodes as U+FFFD)."""
        text = self._pending_text()
        self.prefix_offset = self.read_offset = len(self.ids)
        return text


class StopStringFilter:
    """Cuts the text at the first stop string and holds back a tail that may be the start of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.text = ""
        self.sent = 0

    def feed(self, delta: str) -> tuple[str, bool]:
        """Append decoded text; return (text safe to send now, whether a stop string was reached)."""
        search_from = max(0, len(self.text) - self.longest + 1)
        self.text += delta
        hits = [i for s in self.stops if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            return self.flush(), True
        safe = len(self.text) - self._held_back()
        out = self.text[self.sent:safe]
        self.sent = max(self.sent, safe)
        return out, False

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        for n in range(min(self.longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out


class ChoiceText:
    """The text of one choice, built token by token; always empty without a tokenizer (vLLM's
    skip_tokenizer_init: clients read the token ids)."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], stops: list[str]):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_token_ids) if tokenizer is not None else None
        self.stop = StopStringFilter(stops)

    def push(self, token_id: int) -> tuple[str, bool]:
        """(text to send for this token, whether a stop string ended the choice)."""
        return self.stop.feed(self.detok.push(token_id) if self.detok else "")

    def finish(self) -> tuple[str, bool]:
        """The rest of the text once the engine ends the choice (EOS, length), and whether a stop
        string turned up in it after all."""
        text, stopped = self.stop.feed(self.detok.flush() if self.detok else "")
        return text + self.stop.flush(), stopped
