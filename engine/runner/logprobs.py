"""Log-probabilities for the requests that ask (``SamplingParams.logprobs`` / ``prompt_logprobs``).

As vLLM's default (``logprobs_mode="raw_logprobs"``) they are the model's own distribution, the
log_softmax of the raw logits, before temperature, top-k and top-p shape what is sampled. A step with
no request asking computes nothing here: the model returns only the sampling rows' logits, as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from stallfree.engine.request import TokenLogprob
from stallfree.engine.scheduler.output import ScheduledUnit


@dataclass
class PromptRows:
    """The flat-batch rows whose logits a step also needs: the prompt positions of requests asking
    prompt_logprobs, each with the prompt token it predicts."""

    flat_indices: np.ndarray  # int64, appended to the sampling rows' logits indices
    targets: list[int]  # the token each row predicts
    ks: list[int]  # each row's top-k
    spans: list[tuple[str, int]] = field(default_factory=list)  # (request id, number of rows), in row order


def prompt_rows(units: list[ScheduledUnit], query_start_loc: np.ndarray) -> PromptRows | None:
    """The prompt rows of ``units`` (laid out by ``query_start_loc``); None when no unit has any."""
    asking = [(i, u) for i, u in enumerate(units) if u.prompt_logprob_targets]
    if not asking:
        return None
    rows = PromptRows(np.concatenate([np.arange(query_start_loc[i], query_start_loc[i] + len(u.prompt_logprob_targets))
                                      for i, u in asking]), [], [])
    for _, u in asking:
        rows.targets += u.prompt_logprob_targets
        rows.ks += [u.sampling_params.prompt_logprobs] * len(u.prompt_logprob_targets)
        rows.spans.append((u.request_id, len(u.prompt_logprob_targets)))
    return rows


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int]) -> list[TokenLogprob]:
    """``logits``: fp32 [rows, vocab]; ``token_ids``: [rows], the token each row scores; ``ks``: each
    row's top-k. Each row's TokenLogprob, read back in one device->host copy per tensor."""
    logprobs = logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    ranks = (logprobs > chosen.unsqueeze(1)).sum(dim=1) + 1
    top_values, top_ids = logprobs.topk(max(ks), dim=-1)
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    return [TokenLogprob(token, value, rank, list(zip(top_ids[row][:k], top_values[row][:k], strict=True)))
            for row, (token, value, rank, k) in enumerate(zip(token_ids.tolist(), chosen.tolist(), ranks.tolist(),
                                                              ks, strict=True))]


def split_prompt_logprobs(rows: PromptRows, logprobs: list[TokenLogprob]) -> dict[str, list[TokenLogprob]]:
    """The rows' logprobs by request id."""
    out, start = {}, 0
    for request_id, n in rows.spans:
        out[request_id] = logprobs[start:start + n]
        start += n
    return out
