"""Offline throughput: stallfree's LLM.generate vs HF transformers generate (static batching), same dtype.

32 requests x 512 prompt / 128 output tokens (ignore_eos) on preset ``small`` by default. Also reports
decode step time at batch 1 and 32, prefill tokens/s of a 512-token chunk, and each as a fraction of
this machine's measured limits (matmul FLOP/s in the run's dtype; weight bytes / memory bandwidth), which
it also caches for the engine's MFU / MBU (engine/utilization/measured_limits.py).

    python benchmarks/engine_throughput.py [--model small] [--out benchmarks/results/engine_throughput.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from stallfree.engine import LLM, SamplingParams
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.utilization import machine_limits


def linear_param_counts(arch: ArchConfig) -> tuple[int, int]:
    """Weights every token multiplies (all linears, lm_head included), and lm_head's share."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    per_layer = arch.hidden_size * (q + 2 * kv) + q * arch.hidden_size + 3 * arch.hidden_size * arch.intermediate_size
    lm_head = arch.vocab_size * arch.hidden_size
    return arch.num_layers * per_layer + lm_head, lm_head


def make_prompts(num: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (num, length), generator=g).tolist()


def run_hf(path: Path, prompts: list[list[int]], max_tokens: int, dtype: torch.dtype) -> float:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    ids = torch.tensor(prompts)  # equal lengths: left padding adds nothing, the mask is all ones
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        elapsed = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + max_tokens
    return len(prompts) * max_tokens / elapsed


def run_engine(model: str, policy: str, prompts, max_tokens: int, dtype: str, **knobs):
    llm = LLM(model, scheduler=policy, dtype=dtype, **knobs)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    llm.engine.batch_records.clear()
    llm.engine.reset_prefix_cache()  # the warm-up's prompts are measured again
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == max_tokens for o in outs)
    return len(prompts) * max_tokens / elapsed, llm


def iteration_times(llm: LLM, *, prefill_tokens: int = 0, decode_seqs: int = 0) -> float:
    times = [r.end_time - r.start_time for r in llm.engine.batch_records
             if r.num_prefill_tokens == prefill_tokens and r.num_decode_seqs == decode_seqs]
    return statistics.median(times)


def workload_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The options every benchmark shares: the model and the 32 x 512 / 128 workload, and where to write."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=out)
    return ap


def main() -> None:
    ap = workload_parser(__doc__, "benchmarks/results/engine_throughput.json")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    path = resolve_model_path(args.model)
    cfg = json.loads((path / "config.json").read_text())
    prompts = make_prompts(args.num_requests, args.prompt_len, cfg["vocab_size"])
    result: dict = {"model": args.model, "dtype": args.dtype, "num_requests": args.num_requests,
                    "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "threads": args.threads}

    limits = machine_limits(torch.device("cpu"), torch_dtype, refresh=True)  # measured now; cached for MFU / MBU
    result["matmul_flops"], result["memory_bandwidth_bytes_s"] = limits.peak_flops, limits.bandwidth

    tput_sarathi, llm = run_engine(args.model, "sarathi", prompts, args.max_tokens, args.dtype, chunk_size=512)
    result["engine_sarathi_tok_s"] = tput_sarathi
    tput_vllm, llm_vllm = run_engine(args.model, "vllm", prompts, args.max_tokens, args.dtype,
                                     max_num_batched_tokens=4096)
    result["engine_vllm_tok_s"] = tput_vllm
    result["hf_tok_s"] = run_hf(path, prompts, args.max_tokens, torch_dtype)
    result["ratio_sarathi_vs_hf"] = tput_sarathi / result["hf_tok_s"]
    result["ratio_vllm_vs_hf"] = tput_vllm / result["hf_tok_s"]

    # Iteration-level figures from the engine's own records.
    result["decode_step_s_batch32"] = iteration_times(llm_vllm, decode_seqs=args.num_requests)
    result["prefill_512_chunk_s"] = iteration_times(llm, prefill_tokens=512)
    result["prefill_tok_s"] = 512 / result["prefill_512_chunk_s"]
    _, single = run_engine(args.model, "sarathi", prompts[:1], 64, args.dtype, chunk_size=512)
    result["decode_step_s_batch1"] = iteration_times(single, decode_seqs=1)

    linear_params, lm_head = linear_param_counts(ArchConfig.from_dir(path))
    weight_bytes = linear_params * torch_dtype.itemsize
    prefill_flops = 2 * (linear_params - lm_head) * 512 + 2 * lm_head  # lm_head only for the last token
    result["weight_bytes"] = weight_bytes
    result["prefill_frac_of_matmul_peak"] = prefill_flops / result["prefill_512_chunk_s"] / result["matmul_flops"]
    ideal_decode = weight_bytes / result["memory_bandwidth_bytes_s"]
    result["decode_b1_frac_of_bandwidth_bound"] = ideal_decode / result["decode_step_s_batch1"]
    decode32_flops = 2 * linear_params * args.num_requests
    result["decode_b32_frac_of_matmul_peak"] = decode32_flops / result["decode_step_s_batch32"] / result["matmul_flops"]
    result["decode_b32_frac_of_bandwidth_bound"] = ideal_decode / result["decode_step_s_batch32"]

    write_result(result, args.out)


def write_result(result: dict, path: str) -> None:
    """Save the figures as JSON and print them, one per line."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for key, value in result.items():
        print(f"{key:38s} {value:.4g}" if isinstance(value, float) else f"{key:38s} {value}")


if __name__ == "__main__":
    main()
