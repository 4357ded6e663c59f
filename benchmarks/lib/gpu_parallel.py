"""The multi-GPU targets of benchmarks/gpu.py (NCCL, one GPU per rank): TP2 greedy tokens equal to TP1, and
PP2 greedy tokens equal to PP1 with the pipeline's bubble fraction under sarathi and vllm recorded. On a
machine with fewer than 2 GPUs they are skipped, and the result says so and why."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.lib.gpu_checks import CHECK_MAX_TOKENS, check_prompts
from stallfree.engine import LLM, BatchRecord, SamplingParams
from stallfree.engine.records.request_metrics import pipeline_summary

PP_PROMPTS = 32  # the PP2 bubble run: enough requests to keep two micro-batches in flight
PP_PROMPT_LEN, PP_MAX_TOKENS = 256, 32


def gpus(device: torch.device) -> int:
    return torch.cuda.device_count() if device.type == "cuda" else 0


def skipped(device: torch.device) -> dict | None:
    count = gpus(device)
    return {"skipped": f"needs 2 GPUs, this machine has {count}"} if count < 2 else None


def greedy_tokens(path: Path, prompts: list[list[int]], max_tokens: int, engine_kwargs: dict,
                  scheduler: str = "sarathi", **parallel: int) -> tuple[list[list[int]], list[BatchRecord]]:
    """Greedy tokens of ``prompts`` on an engine of the given parallel sizes, and its BatchRecords."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm = LLM(str(path), scheduler=scheduler, chunk_size=64, max_num_seqs=32, max_model_len=512,
              **parallel, **engine_kwargs)
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    records = list(llm.engine.batch_records)
    llm.engine.shutdown()
    return tokens, records


def equal_tokens(a: list[list[int]], b: list[list[int]]) -> dict:
    equal = [x == y for x, y in zip(a, b, strict=True)]
    return {"equal": all(equal), "prompts": len(equal), "prompts_equal": sum(equal)}


def tp2_check(path: Path, device: torch.device, engine_kwargs: dict) -> dict:
    """TP1 and TP2 greedy tokens on the check checkpoint (sarathi, chunk 64), or why it was skipped."""
    if (skip := skipped(device)) is not None:
        return skip
    prompts = check_prompts(path)
    tp1, tp2 = (greedy_tokens(path, prompts, CHECK_MAX_TOKENS, engine_kwargs, tensor_parallel_size=tp)[0]
                for tp in (1, 2))
    return equal_tokens(tp1, tp2)


def pp2_check(path: Path, device: torch.device, engine_kwargs: dict) -> dict:
    """PP1 and PP2 greedy tokens on the check checkpoint, then the PP2 bubble fraction of an offline batch
    (PP_PROMPTS prompts arriving together) under sarathi and vllm; or why it was skipped."""
    if (skip := skipped(device)) is not None:
        return skip
    prompts = check_prompts(path)
    pp1, pp2 = (greedy_tokens(path, prompts, CHECK_MAX_TOKENS, engine_kwargs, pipeline_parallel_size=pp)[0]
                for pp in (1, 2))
    result = equal_tokens(pp1, pp2)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, vocab, (PP_PROMPT_LEN,), generator=g).tolist() for _ in range(PP_PROMPTS)]
    result["bubble_fraction"] = {
        policy: pipeline_summary(greedy_tokens(path, batch, PP_MAX_TOKENS, engine_kwargs, scheduler=policy,
                                               pipeline_parallel_size=2)[1])["pipeline_bubble_fraction"]
        for policy in ("sarathi", "vllm")}
    result["bubble_workload"] = f"{PP_PROMPTS} prompts x {PP_PROMPT_LEN} tokens, {PP_MAX_TOKENS} out, at once"
    return result


def verdict(check: dict) -> str:
    if "skipped" in check:
        return f"SKIPPED ({check['skipped']})"
    return "PASS" if check["equal"] else "FAIL"
