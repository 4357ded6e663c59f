"""Incremental detokenization with tokenizers' DecodeStream: the same text, piece by piece, as the
two-decode sliding window it replaced (kept below as the reference), for the preset's byte-level BPE
and a SentencePiece-style byte-fallback tokenizer; windows for tokenizers DecodeStream cannot serve."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, trainers
from transformers import PreTrainedTokenizerFast

from stallfree.engine.model.presets import resolve_model_path, synthetic_corpus
from stallfree.engine.server.text import ChoiceText, IncrementalDetokenizer, decode_stream_backend
from stallfree.engine.tokenizer import load_tokenizer
from tests.helpers.server import BYTE_CHARS, ENGINE, PROMPT

UNICODE = "naïve café — ok 😀 done"


class WindowReference:
    """engine/server/text.py's IncrementalDetokenizer before DecodeStream, unchanged."""

    def __init__(self, tokenizer, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_token_ids[-5:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _pending_text(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        return full[len(prefix):] if len(full) > len(prefix) else ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self._pending_text()
        if not text or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text

    def flush(self) -> str:
        text = self._pending_text()
        self.prefix_offset = self.read_offset = len(self.ids)
        return text


def pieces(detok, token_ids: list[int]) -> list[str]:
    return [detok.push(t) for t in token_ids] + [detok.flush()]


@pytest.fixture(scope="module")
def preset_tok():
    return load_tokenizer(resolve_model_path(ENGINE["model"]), None, False)[0]


@pytest.fixture(scope="module")
def byte_fallback_tok():
    """Llama-2 style: BPE with <0xNN> byte-fallback tokens, "▁" for spaces, a decoder that strips the
    first leading space."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(synthetic_corpus(0)[:200] + [UNICODE] * 5,
                            trainer=trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def random_sequences(tok, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) pairs: any ids, mostly single-byte tokens (characters split across tokens,
    incomplete ones), and byte tokens with the special tokens <unk>, <s>, </s> (skipped in the text)."""
    rng = random.Random(seed)
    vocab = len(tok)
    byte_ids = [i for s, i in tok.get_vocab().items() if len(s) == 1 or s.startswith("<0x")]
    out = []
    for k in range(n):
        draws = [lambda: rng.randrange(vocab),
                 lambda: rng.choice(byte_ids) if rng.random() < 0.7 else rng.randrange(vocab),
                 lambda: rng.choice(byte_ids + [0, 1, 2])][k % 3]
        out.append(([draws() for _ in range(rng.randint(0, 8))], [draws() for _ in range(rng.randint(1, 40))]))
    return out


@pytest.mark.parametrize("which", ["preset_tok", "byte_fallback_tok"])
def test_decode_stream_gives_the_same_pieces_as_before(which, request, preset_tok):
    tok = request.getfixturevalue(which)
    assert decode_stream_backend(tok) is tok.backend_tokenizer
    # the test prompts: plain text, a chat rendering, a multi-byte text, each continued by another text
    cases = [(tok.encode(prompt), tok.encode(continuation, add_special_tokens=False)) for prompt, continuation in
             [(PROMPT, " and runs away"), ("<|user|>\nhello there\n<|assistant|>\n", "hi"), ("say: ", UNICODE),
              (UNICODE, UNICODE[::-1])]]
    if which == "preset_tok":  # one byte token per UTF-8 byte: every multi-byte character split
        byte_ids = tok.convert_tokens_to_ids([BYTE_CHARS[b] for b in UNICODE.encode()])
        cases += [(tok.encode("say:"), byte_ids), (byte_ids[:7], byte_ids[7:]), ([], byte_ids + [2, 1] + byte_ids)]
    for i, (prompt, output) in enumerate(cases + random_sequences(tok, 1500, seed=11)):
        detok = IncrementalDetokenizer(tok, prompt)
        assert detok.stream is not None or i >= len(cases)
        assert pieces(detok, output) == pieces(WindowReference(tok, prompt), output), (prompt, output)


def test_prompt_ending_mid_character_keeps_windows(preset_tok):
    """A token-id prompt that ends inside a character: DecodeStream would emit the prompt context as
    text, so that request is decoded with windows (which drop the half character, as before)."""
    tok = preset_tok
    head = tok.convert_tokens_to_ids([BYTE_CHARS[b] for b in "é".encode()])
    prompt, output = tok.encode("hi ") + head[:1], head[1:] + tok.encode(" ok")
    detok = IncrementalDetokenizer(tok, prompt)
    assert detok.stream is None
    got = pieces(detok, output)
    assert got == pieces(WindowReference(tok, prompt), output) and got[0] == "" and "".join(got) == " ok"


class SlowTokenizer:
    """A tokenizer with no Rust backend (like a pure-Python or SentencePiece one): decode only."""

    def __init__(self, fast):
        self.decode = fast.decode


def test_tokenizers_without_a_plain_rust_decode_use_windows(preset_tok):
    slow = SlowTokenizer(preset_tok)
    assert decode_stream_backend(slow) is None
    ids = preset_tok.encode(PROMPT + " " + UNICODE)
    assert pieces(IncrementalDetokenizer(slow, ids[:4]), ids[4:]) == pieces(WindowReference(slow, ids[:4]), ids[4:])
    # WordPiece with clean-up: decode() removes spaces before punctuation afterwards, DecodeStream would not
    vocab = {"[UNK]": 0, "hello": 1, ".": 2, "world": 3, "##s": 4}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    cleaned = PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", clean_up_tokenization_spaces=True)
    assert cleaned.decode([1, 2]) == "hello." and decode_stream_backend(cleaned) is None
    assert pieces(IncrementalDetokenizer(cleaned, [1]), [3, 4, 2]) == pieces(WindowReference(cleaned, [1]), [3, 4, 2])
    assert decode_stream_backend(preset_tok) is not None


def test_stop_strings_on_streamed_text(preset_tok):
    """ChoiceText (DecodeStream + stop-string hold-back) cuts where the whole text has the stop string."""
    ids = preset_tok.encode(" the quick brown fox jumps over the lazy dog " + UNICODE)
    full = preset_tok.decode(ids)
    for stop in ["fox", "lazy d", "é", "😀", "og n"]:
        choice, sent, stopped = ChoiceText(preset_tok, [], [stop]), "", False
        for t in ids:
            text, stopped = choice.push(t)
            sent += text
            if stopped:
                break
        assert stopped and sent == full[:full.index(stop)], stop


class InvalidPrefixStream:
    def step(self, tokenizer, token_id):
        raise Exception("Invalid prefix encountered")


def test_decode_stream_error_goes_on_with_windows(preset_tok):
    ids = preset_tok.encode(PROMPT + " " + UNICODE)
    detok, reference = IncrementalDetokenizer(preset_tok, ids[:5]), WindowReference(preset_tok, ids[:5])
    got = [detok.push(t) for t in ids[5:12]]
    detok.stream = InvalidPrefixStream()
    got += [detok.push(t) for t in ids[12:]] + [detok.flush()]
    assert detok.stream is None and got == pieces(reference, ids[5:])
