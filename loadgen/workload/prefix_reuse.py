"""Prompts that share prefixes, as token ids (``lengths.kind: shared_prefix``; ``hash_trace`` in
loadgen/workload/hash_trace.py), and the hit rate an unbounded prefix cache would reach on any workload's
prompts (``ideal_hit_rate``), which a run's summary sets beside the hit rate the server measured.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stallfree.engine.config_checks import is_int, require


@dataclass(frozen=True)
class TokenIds:
    """What a workload of token ids draws: ``num_requests`` prompts of ids in [low, high)."""

    num_requests: int
    low: int
    high: int


def shared_prefix(rng: np.random.Generator, draw: TokenIds, num_prefixes: int, prefix_len: int, suffix_len: int,
                  output_len: int) -> list[tuple[list[int], int]]:
    """vLLM's ``prefix_repetition`` and SGLang's ``generated-shared-prefix``: ``num_prefixes`` random prefixes
    of ``prefix_len`` tokens, each request one of them (as many requests each, in a random order) followed by
    ``suffix_len`` random tokens of its own, and ``output_len`` output tokens. (prompt, output length) pairs."""
    for key, value, low in (("num_prefixes", num_prefixes, 1), ("prefix_len", prefix_len, 1),
                            ("suffix_len", suffix_len, 0), ("output_len", output_len, 1)):
        require(is_int(value) and value >= low, f"lengths.{key}", f"an integer >= {low}", value)
    prefixes = rng.integers(draw.low, draw.high, size=(num_prefixes, prefix_len))
    suffixes = rng.integers(draw.low, draw.high, size=(draw.num_requests, suffix_len))
    groups = rng.permutation(np.arange(draw.num_requests) % num_prefixes)
    return [(prefixes[g].tolist() + suffixes[i].tolist(), output_len) for i, g in enumerate(groups)]



def ideal_hit_rate(prompts: Sequence[Sequence[int]], block_size: int) -> float | None:
    """The share of prompt tokens an unbounded prefix cache of ``block_size``-token blocks serves, prompts
    taken in order: each prompt's leading full blocks (short of its last token, which is always computed)
    that an earlier prompt had, chained so a block counts only after all blocks before it. None for no
    tokens."""
    seen: set[int] = set()
    hits = total = 0
    for ids in prompts:
        keys, parent = [], 0
        for start in range(0, len(ids) - block_size + 1, block_size):
            parent = hash((parent, tuple(ids[start:start + block_size])))
            keys.append(parent)
        usable = (len(ids) - 1) // block_size
        run = next((k for k in range(usable) if keys[k] not in seen), usable)
        hits += run * block_size
        total += len(ids)
        seen.update(keys)
    return hits / total if total else None
