"""The multi-GPU targets of benchmarks/gpu.py: TP2 greedy tokens equal to TP1 (NCCL, one GPU per rank).
On a machine with fewer than 2 GPUs they are skipped, and the result says so and why."""
from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.lib.gpu_checks import CHECK_MAX_TOKENS, check_prompts
from stallfree.engine import LLM, SamplingParams


def gpus(device: torch.device) -> int:
    return torch.cuda.device_count() if device.type == "cuda" else 0


def tp2_check(path: Path, device: torch.device, engine_kwargs: dict) -> dict:
    """TP1 and TP2 greedy tokens on the check checkpoint (sarathi, chunk 64), or why it was skipped."""
    if (count := gpus(device)) < 2:
        return {"skipped": f"needs 2 GPUs, this machine has {count}"}
    prompts = check_prompts(path)
    params = SamplingParams(max_tokens=CHECK_MAX_TOKENS, temperature=0.0, ignore_eos=True)
    tokens = {}
    for tp in (1, 2):
        llm = LLM(str(path), scheduler="sarathi", chunk_size=64, max_num_seqs=8, max_model_len=512,
                  tensor_parallel_size=tp, **engine_kwargs)
        tokens[tp] = [o.token_ids for o in llm.generate(prompts, params)]
        llm.engine.shutdown()
        del llm
    equal = [a == b for a, b in zip(tokens[1], tokens[2], strict=True)]
    return {"equal": all(equal), "prompts": len(prompts), "prompts_equal": sum(equal)}


def verdict(check: dict) -> str:
    if "skipped" in check:
        return f"SKIPPED ({check['skipped']})"
    return "PASS" if check["equal"] else "FAIL"
