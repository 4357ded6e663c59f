"""Workloads: arrival processes + length distributions -> a list of RequestSpec, all from one seed.

Send times are offsets (seconds) from the run start, computed up front. Configs are plain dicts,
e.g. ``{"kind": "poisson", "qps": 2}`` and ``{"kind": "trace", "name": "arxiv_summarization", "scale": 8}``.

The seed is split into three independent streams (arrivals, lengths, prompt tokens), so changing
the arrival process or its rate keeps the same request lengths and prompts: a QPS sweep replays the
same requests at different rates.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from stallfree.engine.config_checks import is_int, is_number, require
from stallfree.engine.records.request_spec import RequestSpec
from stallfree.loadgen.workload.conversations import sharegpt_sessions
from stallfree.loadgen.workload.hash_trace import TRACES_DIR, hash_trace, hash_trace_columns, is_hash_trace
from stallfree.loadgen.workload.prefix_reuse import TokenIds, shared_prefix
from stallfree.loadgen.workload.ramp import RampUp
from stallfree.loadgen.workload.sessions import SESSION_WORKLOADS, session_specs
from stallfree.loadgen.workload.text_prompts import TEXT_WORKLOADS, LengthTexts, Tokenizer, take


def _positive(key: str, value: object) -> None:
    require(is_number(value) and value > 0, key, "> 0", value)


@functools.cache
def load_trace(name: str) -> dict[str, np.ndarray]:
    """Columns of a trace CSV: a bundled name (``azure_conv``) or a path to a ``.csv`` file; or of a hash-id
    trace (loadgen/workload/hash_trace.py), a bundled name or a ``.jsonl`` file."""
    if is_hash_trace(name) or name.endswith(".jsonl"):
        return hash_trace_columns(name)
    path = Path(name) if name.endswith(".csv") else TRACES_DIR / f"{name}.csv"
    if not path.is_file():
        bundled = sorted(p.stem for p in TRACES_DIR.glob("*.csv"))
        raise ValueError(f"trace name {name!r}: no file {path} (bundled traces: {bundled})")
    header = path.read_text().split("\n", 1)[0].strip().split(",")
    data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    return {col: data[:, i] for i, col in enumerate(header)}


def _checked_trace(name: str, key: str, n: int) -> dict[str, np.ndarray]:
    try:
        trace = load_trace(name)
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None
    rows = len(next(iter(trace.values())))
    require(n <= rows, "num_requests", f"<= the {rows} rows of trace {name!r}", n)
    return trace


# ----------------------------------------------------------------------------- arrivals


def poisson(rng: np.random.Generator, n: int, qps: float) -> np.ndarray:
    """Exponential inter-arrival gaps with mean 1/qps; the first request is sent at 0."""
    _positive("arrival.qps", qps)
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / qps, n - 1))])


def gamma(rng: np.random.Generator, n: int, qps: float, cv: float = 1.0,
          burstiness: float | None = None) -> np.ndarray:
    """Gamma inter-arrival gaps with mean 1/qps and coefficient of variation cv (cv=1: Poisson), or
    vLLM's ``--burstiness`` (the gamma shape: cv = 1 / sqrt(burstiness); < 1 burstier than Poisson)."""
    _positive("arrival.qps", qps)
    if burstiness is not None:
        _positive("arrival.burstiness", burstiness)
        cv = burstiness ** -0.5
    _positive("arrival.cv", cv)
    shape = 1.0 / cv**2
    return np.concatenate([[0.0], np.cumsum(rng.gamma(shape, 1.0 / (qps * shape), n - 1))])


def constant(rng: np.random.Generator, n: int, qps: float) -> np.ndarray:
    _positive("arrival.qps", qps)
    return np.arange(n) / qps


def burst(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.zeros(n)


def trace_arrivals(rng: np.random.Generator, n: int, time_scale: float = 1.0,
                   name: str = "azure_conv") -> np.ndarray:
    """The first n recorded ``arrived_at`` times (relative to the first) x time_scale."""
    _positive("arrival.time_scale", time_scale)
    trace = _checked_trace(name, "arrival.name", n)
    require("arrived_at" in trace, "arrival.name", "a trace with an arrived_at column", name)
    times = trace["arrived_at"][:n]
    return (times - times[0]) * time_scale


ARRIVALS: dict[str, Callable[..., np.ndarray]] = {
    "poisson": poisson, "gamma": gamma, "constant": constant, "burst": burst, "trace": trace_arrivals,
}

# ----------------------------------------------------------------------------- lengths
# Each returns (prompt_lengths, output_lengths) as integer arrays of size n.

Lengths = tuple[np.ndarray, np.ndarray]


def fixed(rng: np.random.Generator, n: int, prompt: int, output: int) -> Lengths:
    require(is_int(prompt) and prompt >= 1, "lengths.prompt", "an integer >= 1", prompt)
    require(is_int(output) and output >= 1, "lengths.output", "an integer >= 1", output)
    return np.full(n, prompt), np.full(n, output)


def _power_law(rng: np.random.Generator, n: int, key: str, lo: int, hi: int, alpha: float) -> np.ndarray:
    """Integers in [lo, hi] with P(lo + k) proportional to (k + 1) ** -alpha (alpha=0: uniform)."""
    require(is_int(lo) and lo >= 1, f"lengths.{key}_lo", "an integer >= 1", lo)
    require(is_int(hi) and hi >= lo, f"lengths.{key}_hi", f"an integer >= {key}_lo ({lo})", hi)
    weights = np.arange(1, hi - lo + 2, dtype=float) ** -alpha
    return lo + rng.choice(hi - lo + 1, size=n, p=weights / weights.sum())


def uniform(rng: np.random.Generator, n: int, prompt_lo: int, prompt_hi: int,
            output_lo: int, output_hi: int) -> Lengths:
    """Uniform integers, bounds inclusive."""
    return (_power_law(rng, n, "prompt", prompt_lo, prompt_hi, 0.0),
            _power_law(rng, n, "output", output_lo, output_hi, 0.0))


def random_lengths(rng: np.random.Generator, n: int, input_len: int, output_len: int,
                   range_ratio: float = 0.0) -> Lengths:
    """vLLM's ``bench serve --dataset-name random``: uniform integers in [len x (1 - range_ratio),
    len x (1 + range_ratio)], at least 1."""
    require(is_number(range_ratio) and 0 <= range_ratio < 1, "lengths.range_ratio", "a number in [0, 1)",
            range_ratio)
    bounds = []
    for key, length in (("input_len", input_len), ("output_len", output_len)):
        require(is_int(length) and length >= 1, f"lengths.{key}", "an integer >= 1", length)
        bounds.append((max(1, int(length * (1 - range_ratio))), int(length * (1 + range_ratio))))
    return tuple(_power_law(rng, n, key, lo, hi, 0.0) for key, (lo, hi) in zip(("prompt", "output"), bounds,
                                                                              strict=True))


def zipf(rng: np.random.Generator, n: int, prompt_lo: int, prompt_hi: int,
         output_lo: int, output_hi: int, alpha: float = 1.0) -> Lengths:
    """Bounded Zipf: many short requests, a heavy tail of long ones (bounds inclusive)."""
    _positive("lengths.alpha", alpha)
    return (_power_law(rng, n, "prompt", prompt_lo, prompt_hi, alpha),
            _power_law(rng, n, "output", output_lo, output_hi, alpha))


def trace_lengths(rng: np.random.Generator, n: int, name: str, scale: float = 1.0,
                  shuffle: bool = True) -> Lengths:
    """Recorded prefill/decode token counts divided by ``scale`` (rounded, min 1 token each).

    Rows are drawn at random without replacement by the seed; ``shuffle=False`` takes the first n
    rows in file order instead (pairs row for row with the ``trace`` arrival process on azure_conv).
    """
    _positive("lengths.scale", scale)
    trace = _checked_trace(name, "lengths.name", n)
    rows = rng.permutation(len(trace["num_prefill_tokens"]))[:n] if shuffle else np.arange(n)
    scaled = [np.maximum(1, np.rint(trace[col][rows] / scale)).astype(int)
              for col in ("num_prefill_tokens", "num_decode_tokens")]
    return scaled[0], scaled[1]


LENGTHS: dict[str, Callable[..., Lengths]] = {
    "fixed": fixed, "uniform": uniform, "random": random_lengths, "zipf": zipf, "trace": trace_lengths,
}
# Workloads whose prompts' tokens matter, not only their lengths: (prompt, output length) pairs.
TEXT_SESSION_WORKLOADS = {"sharegpt_sessions": sharegpt_sessions}  # sessions read from conversation files
PROMPT_WORKLOADS: dict[str, Callable[..., list[tuple[list[int], int]]]] = {
    "shared_prefix": shared_prefix, "hash_trace": hash_trace,
}


def clip_lengths(prompt: np.ndarray, output: np.ndarray, max_total_tokens: int) -> Lengths:
    """Shrink requests longer than max_total_tokens to exactly that total, keeping prompt:output.

    The clipped prompt is round(prompt * max_total / total), kept within [1, max_total - 1]; the
    output gets the rest, so both stay >= 1 token. Requests that fit are unchanged.
    """
    require(max_total_tokens >= 2, "max_total_tokens", ">= 2", max_total_tokens)
    total = prompt + output
    over = total > max_total_tokens
    clipped_prompt = np.clip(np.rint(prompt * max_total_tokens / total), 1, max_total_tokens - 1).astype(int)
    new_prompt = np.where(over, clipped_prompt, prompt)
    return new_prompt, np.where(over, max_total_tokens - new_prompt, output)


# ----------------------------------------------------------------------------- builder


def _call(table: dict[str, Callable], section: str, config: dict, rng: np.random.Generator,
          n_or_tokenizer: int | Tokenizer | TokenIds):
    """``table[kind](rng, n_or_tokenizer, **settings)``, each setting checked against the function's
    signature."""
    params = dict(config)
    kind = params.pop("kind", None)
    if kind not in table:
        raise ValueError(f"{section}.kind must be one of {sorted(table)}, got {kind!r}")
    fn = table[kind]
    settings = list(inspect.signature(fn).parameters.values())[2:]  # after (rng, n), (rng, tokenizer) or (rng, draw)
    names = [p.name for p in settings]
    for key in params:
        if key not in names:
            raise ValueError(f"{section}.{key} is not a setting of kind {kind!r} (settings: {names})")
    for p in settings:
        if p.default is inspect.Parameter.empty and p.name not in params:
            raise ValueError(f"{section}.{p.name} is required for kind {kind!r}")
    return fn(rng, n_or_tokenizer, **params)


def is_text_workload(lengths: dict) -> bool:
    return lengths.get("kind") in TEXT_WORKLOADS or lengths.get("kind") in TEXT_SESSION_WORKLOADS


def _text_specs(lengths: dict, offsets: np.ndarray, rng: np.random.Generator, tokenizer: Tokenizer | None,
                max_total_tokens: int | None) -> list[RequestSpec]:
    require(tokenizer is not None, "tokenizer", "given for a text workload", None)
    requests = take(_call(TEXT_WORKLOADS, "lengths", lengths, rng, tokenizer), len(offsets), max_total_tokens)
    return [RequestSpec(request_id=f"req-{i:06d}", send_offset_s=float(offsets[i]),
                        prompt_token_ids=list(r.prompt_token_ids), max_tokens=r.max_tokens, prompt=r.prompt,
                        messages=r.messages)
            for i, r in enumerate(requests)]


def build_workload(arrival: dict, lengths: dict, num_requests: int, seed: int, vocab_size: int,
                   max_total_tokens: int | None = None, low_token_id: int = 10,
                   tokenizer: Tokenizer | None = None) -> list[RequestSpec]:
    """Requests with send offsets from ``arrival``, lengths from ``lengths`` (clipped to
    ``max_total_tokens`` when given) and random prompt token ids in [low_token_id, vocab_size).

    A text workload (loadgen.workload.text_prompts) gives the prompts instead, tokenized with ``tokenizer``;
    requests over ``max_total_tokens`` are skipped, not clipped. Raises ValueError naming the
    offending key for any bad setting.
    """
    require(num_requests >= 1, "num_requests", ">= 1", num_requests)
    require(vocab_size > low_token_id, "vocab_size", f"> low_token_id ({low_token_id})", vocab_size)
    arrival_rng, length_rng, token_rng = (np.random.default_rng(s)
                                          for s in np.random.SeedSequence(seed).spawn(3))
    ramp, arrival = RampUp.split(arrival)
    offsets = _call(ARRIVALS, "arrival", {**arrival, "qps": 1.0} if ramp else arrival, arrival_rng, num_requests)
    if ramp:
        offsets = ramp.warp(offsets, num_requests)
    if lengths.get("kind") in SESSION_WORKLOADS:
        sessions = _call(SESSION_WORKLOADS, "lengths", lengths, token_rng, TokenIds(num_requests, low_token_id,
                                                                                 vocab_size))
        return session_specs(sessions, offsets, num_requests, max_total_tokens)
    if lengths.get("kind") in TEXT_SESSION_WORKLOADS:
        require(tokenizer is not None, "tokenizer", "given for a text workload", None)
        sessions = _call(TEXT_SESSION_WORKLOADS, "lengths", lengths, length_rng, tokenizer)
        return session_specs(sessions, offsets, num_requests, max_total_tokens)
    if is_text_workload(lengths):
        return _text_specs(lengths, offsets, length_rng, tokenizer, max_total_tokens)
    if lengths.get("kind") in PROMPT_WORKLOADS:  # clipped as lengths are, each prompt cut short: its prefix kept
        pairs = _call(PROMPT_WORKLOADS, "lengths", lengths, token_rng, TokenIds(num_requests, low_token_id, vocab_size))
        prompt_lens, output_lens = np.array([len(p) for p, _ in pairs]), np.array([o for _, o in pairs])
        if max_total_tokens is not None:
            prompt_lens, output_lens = clip_lengths(prompt_lens, output_lens, max_total_tokens)
        return [RequestSpec(request_id=f"req-{i:06d}", send_offset_s=float(offsets[i]),
                            prompt_token_ids=prompt[:prompt_lens[i]], max_tokens=int(output_lens[i]))
                for i, (prompt, _) in enumerate(pairs)]
    prompt_lens, output_lens = _call(LENGTHS, "lengths", lengths, length_rng, num_requests)
    if max_total_tokens is not None:
        prompt_lens, output_lens = clip_lengths(prompt_lens, output_lens, max_total_tokens)
    tokens = token_rng.integers(low_token_id, vocab_size, size=int(prompt_lens.sum()))
    starts = np.concatenate([[0], np.cumsum(prompt_lens)])
    return [RequestSpec(request_id=f"req-{i:06d}", send_offset_s=float(offsets[i]),
                        prompt_token_ids=tokens[starts[i]:starts[i + 1]].tolist(),
                        max_tokens=int(output_lens[i]))
            for i in range(num_requests)]


def with_text_prompts(specs: Sequence[RequestSpec], texts: LengthTexts) -> list[RequestSpec]:
    """The specs with a text prompt of their prompt length where they have none (a workload of lengths,
    the warm-ups, the decode probe), for a server that takes text only. Each text starts at a corpus
    position drawn from the spec's own token ids, so the same spec always gets the same text."""
    def texted(spec: RequestSpec) -> RequestSpec:
        if spec.prompt is not None or spec.messages is not None:
            return spec
        prompt, ids = texts.prompt(len(spec.prompt_token_ids), int(sum(spec.prompt_token_ids)))
        return dataclasses.replace(spec, prompt=prompt, prompt_token_ids=ids)

    return [texted(spec) for spec in specs]
