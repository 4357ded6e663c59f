"""Token sampling for the whole batch in batched tensor ops on the logits' device.

Greedy rows take the argmax. The other rows are scaled by their temperature, masked by top-k and
top-p, and sampled with the exponential race: ``argmax(probs / q)`` with ``q ~ Exp(1)`` per token
picks token i with probability ``probs[i]`` (the smallest of independent ``Exp(probs[i])`` times), so
one op samples every row. A row's noise comes from its own generator: a seeded request draws the
same noise, hence the same token, whatever batch it is in.
"""
from __future__ import annotations

import torch

from stallfree.engine.native.cpu_kernels import load_cpu_kernels
from stallfree.engine.request import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """``logits``: fp32 [num_seqs, vocab]. Sampled token ids [num_seqs] int64, on the logits' device."""
    greedy_ids = first_argmax(logits)
    random_rows = [not p.greedy for p in params]
    if not any(random_rows):
        return greedy_ids
    probs = filtered_logits(logits, params).softmax(dim=-1)
    noise = exponential_noise(probs, generators)
    random_ids = first_argmax(probs / noise)
    is_random = torch.tensor(random_rows, device=logits.device)
    return torch.where(is_random, random_ids, greedy_ids)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest value (the first of ties), as ``argmax``. On the CPU, fp32 rows go to the
    native kernel (csrc/sampling.cpp); ``max``'s reduction, the fallback, ran 2.8x faster than ``argmax``
    (32 x 32,000 fp32: 0.23 vs 0.64 ms, about 2% of a decode step of `small`)."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0 and x.stride(1) == 1
            and (kernels := load_cpu_kernels()) is not None):
        out = torch.empty(x.shape[0], dtype=torch.int64)
        kernels.argmax_rows_f32(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr(),
                                torch.get_num_threads())
        return out
    return x.max(dim=-1).indices


def filtered_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Logits divided by temperature, with tokens outside top-k, then outside top-p, set to -inf.

    Greedy rows come back unscaled and unfiltered (the caller takes their argmax instead).
    """
    vocab = logits.shape[-1]
    # One host->device copy for the three per-row knobs.
    knobs = torch.tensor([[p.temperature if not p.greedy else 1.0 for p in params],
                          [min(p.top_k, vocab) if p.top_k > 0 and not p.greedy else vocab for p in params],
                          [p.top_p if not p.greedy else 1.0 for p in params]],
                         dtype=torch.float64, device=logits.device)
    temperature, top_k, top_p = knobs[0].to(logits.dtype), knobs[1].long(), knobs[2]
    logits = logits / temperature.unsqueeze(1)
    needs_top_k = any(0 < p.top_k < vocab and not p.greedy for p in params)
    needs_top_p = any(p.top_p < 1.0 and not p.greedy for p in params)
    if not (needs_top_k or needs_top_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    if needs_top_k:
        # Keep every token at least as large as the k-th largest (ties at the k-th stay, as topk would).
        kth = sorted_logits.gather(1, (top_k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if needs_top_p:
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the mass before it already reaches top_p (the first token always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p.to(mass_before.dtype).unsqueeze(1)
        drop_sorted[:, 0] = False  # a top_p that rounds to 0 in the logits' dtype must keep one token
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def exponential_noise(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exp(1) noise shaped like ``probs``; rows sharing a generator get one draw together."""
    noise = torch.ones_like(probs)
    rows_by_generator: dict[int, list[int]] = {}
    by_id: dict[int, torch.Generator] = {}
    for row, gen in enumerate(generators):
        if gen is not None:
            rows_by_generator.setdefault(id(gen), []).append(row)
            by_id[id(gen)] = gen
    for key, rows in rows_by_generator.items():
        if len(rows) == 1:
            noise[rows[0]].exponential_(generator=by_id[key])
        else:
            draw = torch.empty(len(rows), probs.shape[1], dtype=probs.dtype, device=probs.device)
            draw.exponential_(generator=by_id[key])
            noise[rows] = draw
    # An exact 0 would divide a zero probability into NaN; the race's limit is the tiniest positive time.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)
