"""The reference for logprob tests: HF transformers' log_softmax of the same weights' logits."""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch


@cache
def hf_model(path: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_log_softmax(path: Path, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab]: row i is the distribution of the token after ``token_ids[:i + 1]``."""
    return hf_model(path)(torch.tensor([token_ids])).logits[0].float().log_softmax(dim=-1)


def hf_token_logprobs(path: Path, token_ids: list[int]) -> list[float]:
    """The logprob of each token after the first given its prefix."""
    rows = hf_log_softmax(path, token_ids)
    return rows[:-1].gather(1, torch.tensor(token_ids[1:]).unsqueeze(1)).squeeze(1).tolist()
