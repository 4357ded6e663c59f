"""Shared drivers for the engine tests."""
from __future__ import annotations

import random

import pytest
import torch

from stallfree.engine import CostModel, LLMEngine, SamplingParams

# Dtypes of the Triton kernel tests: bf16 only on CUDA, because the Triton 3.9 interpreter's bf16 is
# wrong on the CPU (``tl.dot`` errors around 5e10 on a 16x32x16 product; stores truncate, not round).
TRITON_DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="bf16 is wrong under the Triton 3.9 interpreter (CPU)"))]

# A cost model with fixed coefficients (no profiling): the simulated runner's tests.
FIXED = CostModel(coefficients={"intercept": 0.004, "num_prefill_tokens": 2e-5, "num_decode_seqs": 3e-4,
                                "prefill_attention_work": 1e-8, "decode_context_tokens": 2e-7})


def make_prompts(n: int, seed: int, max_len: int = 300, vocab: int = 2048) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, max_len] + [rng.randint(2, max_len - 1) for _ in range(n - 2)]
    return [[rng.randrange(3, vocab) for _ in range(length)] for length in lengths]


def hf_greedy(path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers' greedy continuation of each prompt in fp32, ignoring EOS: the reference outputs."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    outputs = []
    for prompt in prompts:
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        outputs.append(out[0, len(prompt):].tolist())
    return outputs


def run_staggered(engine: LLMEngine, prompts: list[list[int]], max_tokens, gap: int = 2,
                  params: SamplingParams | None = None) -> dict[str, list[int]]:
    """Add prompt i at iteration i * gap (so requests arrive mid-flight); run to completion."""
    max_tokens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    outputs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    iteration = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] * gap <= iteration:
            i, prompt = pending.pop(0)
            p = params or SamplingParams(max_tokens=max_tokens[i], temperature=0.0, ignore_eos=True)
            engine.add_request(prompt, p, request_id=f"r{i}")
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        iteration += 1
    return outputs


BLOCK = 8  # the KV block size of the prefix-caching tests


def shared_prefix_prompts() -> list[list[int]]:
    """Prompts on two prefixes: whole blocks shared, a partial block shared, a prompt equal to its prefix
    (cached whole on its second coming), one shorter than a block, one longer than a chunk."""
    rng = random.Random(7)
    a = [rng.randrange(3, 2000) for _ in range(5 * BLOCK)]
    b = [rng.randrange(3, 2000) for _ in range(3 * BLOCK + 3)]

    def tail(n):
        return [rng.randrange(3, 2000) for _ in range(n)]

    return [a + tail(9), a + tail(1), a, a, b + tail(20), a[:BLOCK + 3] + tail(4), tail(5), b + tail(90),
            a + tail(13), b[:2 * BLOCK]]
