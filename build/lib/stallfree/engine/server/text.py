"""Per-token text for streaming: incremental detokenization and stop strings on the decoded text."""
from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# Prompt tokens decoded before the first output token, so it gets the spacing it has mid-sequence
# (SentencePiece-style tokenizers drop a leading space when a token is decoded on its own).
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"
# transformers' fast-tokenizer decode: the Rust decode, then (maybe) the clean-up checked below
PLAIN_DECODES = ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode")
FORCE_BPE_CLEANUP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def decode_stream_backend(tokenizer) -> Tokenizer | None:
    """The ``tokenizers.Tokenizer`` that DecodeStream steps when its text is exactly that of
    ``tokenizer.decode``; None when it may not be, and the detokenizer decodes windows with
    ``tokenizer.decode`` as before. That is the case for a slow tokenizer (pure Python or SentencePiece:
    no Rust tokenizer to step), for a tokenizer class with its own ``_decode``, and for one whose
    decode cleans up tokenization spaces after the Rust decode (" ." -> "."), which DecodeStream does
    not do (transformers 5 skips that clean-up for BPE models unless forced)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer) or type(tokenizer)._decode.__qualname__ not in PLAIN_DECODES:
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        skipped_for_bpe = hasattr(tokenizer, FORCE_BPE_CLEANUP) and not getattr(tokenizer, FORCE_BPE_CLEANUP)
        if not (skipped_for_bpe and type(backend.model).__name__ == "BPE"):
            return None
    return backend


class IncrementalDetokenizer:
    """vLLM-style incremental decode: a token that ends in the middle of a UTF-8 sequence (byte-level
    BPE, byte fallback) yields no text until the character is complete.

    Fast tokenizers step a ``tokenizers.decoders.DecodeStream`` (vLLM's fast detokenizer): one Rust
    decode of a few tokens per token, two when it yields text. Otherwise (see decode_stream_backend)
    the window since the last text is decoded twice with ``tokenizer.decode`` and the new text is the
    difference, the same algorithm DecodeStream runs, so both give the same text.

    ``ids`` is the window: the tokens since the start of the last text piece (at first: the prompt
    context); ``read_offset`` is where the tokens not yet turned into text start. ``flush`` decodes it."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], use_decode_stream: bool = True):
        self.tokenizer = tokenizer
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.read_offset = len(self.ids)
        self.backend = decode_stream_backend(tokenizer) if use_decode_stream else None
        self.stream: DecodeStream | None = None
        # A context that decodes to text ending in U+FFFD (a prompt ending mid-character, only possible
        # with token-id prompts) is not taken as DecodeStream's prefix: it would emit the context.
        if self.backend is not None and \
                not self.backend.decode(self.ids, skip_special_tokens=True).endswith(REPLACEMENT_CHAR):
            self.stream = DecodeStream(ids=self.ids, skip_special_tokens=True)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _pending_text(self) -> str:
        prefix = self._decode(self.ids[:self.read_offset])
        full = self._decode(self.ids)
        return full[len(prefix):] if len(full) > len(prefix) else ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be empty)."""
        self.ids.append(token_id)
        if self.stream is not None:
            try:
                text = self.stream.step(self.backend, token_id)
            except Exception:  # "Invalid prefix encountered" (decoding that is not monotonic, which vLLM
                self.stream = None  # also meets): go on with windows, which need no monotonic decode
            else:
                return "" if text is None else self._advance(text)
        text = self._pending_text()
        if not text or text.endswith(REPLACEMENT_CHAR):
            return ""
        return self._advance(text)

    def _advance(self, text: str) -> str:
        del self.ids[:self.read_offset]
        self.read_offset = len(self.ids)
        return text

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character decodes as U+FFFD)."""
        text = self._pending_text()
        del self.ids[:]
        self.read_offset = 0
        self.stream = None
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
