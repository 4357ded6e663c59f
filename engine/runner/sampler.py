"""Token sampling: greedy rows by argmax, the rest with temperature / top-k / top-p and per-request seeds."""
from __future__ import annotations

import torch

from engine.request import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """``logits``: fp32 [num_seqs, vocab]. One token id per row."""
    tokens = logits.argmax(dim=-1)
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            tokens[row] = sample_row(logits[row], p, gen)
    return tokens.tolist()


def sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
    logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop tokens once the mass before them already reaches top_p (the first token always stays).
        drop = (cumulative - sorted_logits.softmax(-1)) >= p.top_p
        logits = logits.index_fill(0, order[drop], float("-inf"))
    probs = logits.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
