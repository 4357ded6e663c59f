"""CPU time of incremental detokenization per streamed token: tokenizers' DecodeStream (the server's
path for fast tokenizers) vs the two-``tokenizer.decode``-per-token window it replaced (still the path
for tokenizers without a Rust backend), on a preset's tokenizer.

The token stream is the preset tokenizer's encoding of its own synthetic corpus with multi-byte text
mixed in, cut into requests of ``--request-tokens`` tokens (each with a fresh detokenizer and a
32-token prompt), so per-request set-up counts too. Both paths must give the same text piece by piece.

    python -m benchmarks.detokenizer [--preset tiny] [--tokens 20000] [--out benchmarks/results/detokenizer.json]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import tokenizers
import transformers

from benchmarks.engine_throughput import write_result
from stallfree.engine.model.presets import resolve_model_path, synthetic_corpus
from stallfree.engine.server.text import IncrementalDetokenizer
from stallfree.engine.tokenizer import load_tokenizer

PROMPT_TOKENS = 32
UNICODE = " naïve café — ok 😀 Grüße 東京"


def token_stream(tokenizer, num_tokens: int) -> list[int]:
    sentences = synthetic_corpus(1)
    text = "".join(s + (UNICODE if i % 4 == 0 else "") for i, s in enumerate(sentences))
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < num_tokens + PROMPT_TOKENS:
        ids += ids
    return ids[:num_tokens + PROMPT_TOKENS]


def run(tokenizer, ids: list[int], request_tokens: int, use_decode_stream: bool) -> tuple[float, list[str]]:
    """(CPU seconds, the text pieces) for streaming ids[PROMPT_TOKENS:] in requests."""
    pieces: list[str] = []
    start = time.process_time()
    for begin in range(PROMPT_TOKENS, len(ids), request_tokens):
        detok = IncrementalDetokenizer(tokenizer, ids[begin - PROMPT_TOKENS:begin], use_decode_stream)
        pieces += [detok.push(t) for t in ids[begin:begin + request_tokens]]
        pieces.append(detok.flush())
    return time.process_time() - start, pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--request-tokens", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/detokenizer.json")
    args = ap.parse_args()
    tokenizer = load_tokenizer(resolve_model_path(args.preset), None, False)[0]
    ids = token_stream(tokenizer, args.tokens)
    times: dict[bool, list[float]] = {False: [], True: []}
    outputs = {}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        for use_decode_stream in (False, True):
            seconds, outputs[use_decode_stream] = run(tokenizer, ids, args.request_tokens, use_decode_stream)
            times[use_decode_stream].append(seconds)
    assert outputs[True] == outputs[False], "DecodeStream and windowed decode disagree"
    assert "".join(outputs[True]).startswith(tokenizer.decode(ids[PROMPT_TOKENS:PROMPT_TOKENS + 50]))

    def us_per_token(seconds: float) -> float:
        return seconds / args.tokens * 1e6

    window, stream = (min(times[k]) for k in (False, True))
    write_result({
        "preset": args.preset, "tokenizer": type(tokenizer).__name__, "tokens": args.tokens,
        "request_tokens": args.request_tokens, "repeats": args.repeats,
        "window_decode_us_per_token_min": us_per_token(window),
        "window_decode_us_per_token_median": us_per_token(statistics.median(times[False])),
        "decode_stream_us_per_token_min": us_per_token(stream),
        "decode_stream_us_per_token_median": us_per_token(statistics.median(times[True])),
        "speedup_min": window / stream, "identical_text": True,
        "tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
    }, args.out)


if __name__ == "__main__":
    main()
