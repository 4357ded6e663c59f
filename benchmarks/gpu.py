"""GPU engine figures on a Mistral-7B-shaped random bf16 checkpoint (about 5 minutes on an H200).

Machine limits (bf16 matmul TFLOP/s, device copy GB/s); decode iterations at batch 1/8/64/128 with MBU;
prefill-only iterations of 512 and 4096 tokens with MFU; a hybrid iteration (a 512 chunk with 64
decodes) against prefill-only 512; the offline workload 128 x 1024 prompt / 128 output (greedy,
ignore_eos) for sarathi-512 and vllm with the GPU's busy fraction; the same through HF transformers'
continuous batching (``generate_batch``) when the installed transformers has it.

    python benchmarks/gpu.py            # writes benchmarks/results/gpu_<device>.json
    python benchmarks/gpu.py --smoke    # tiny shapes, runs on CPU too (checks the script, not the machine)

Imports only the engine (no Hydra).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine import LLM, SamplingParams
from engine.model.presets import SHAPE_PRESETS
from engine.scheduler.output import ScheduledUnit, SchedulerOutput
from engine.utilization import machine_limits
from engine.utilization.limits import measure_bandwidth, measure_matmul_flops

MISTRAL_7B = SHAPE_PRESETS["mistral-7b-shape"]
SMOKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=2048, max_position_embeddings=8192)
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def limits_figures(device: torch.device, dtype: torch.dtype, smoke: bool) -> dict:
    """The machine limits (engine/utilization/limits.py; a full run refreshes the engine's cached figures)."""
    if smoke:
        flops, bandwidth = measure_matmul_flops(dtype, device, n=1024), measure_bandwidth(device, 1 << 24)
    else:
        limits = machine_limits(device, dtype, refresh=True)
        flops, bandwidth = limits.peak_flops, limits.bandwidth
    return {"matmul_tflops": flops / 1e12, "copy_gb_s": bandwidth / 1e9}


def write_checkpoint(shape: dict, path: Path, device: torch.device, dtype: torch.dtype) -> None:
    """An HF-format Llama directory (config + random weights, no tokenizer), drawn on ``device``."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * h // shape["num_attention_heads"]

    def linear(out_dim: int, in_dim: int) -> torch.Tensor:
        return (torch.randn(out_dim, in_dim, device=device) / in_dim ** 0.5).to(dtype).cpu()

    w = {"model.embed_tokens.weight": torch.randn(shape["vocab_size"], h, device=device).to(dtype).cpu(),
         "model.norm.weight": torch.ones(h, dtype=dtype), "lm_head.weight": linear(shape["vocab_size"], h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": linear(h, h), p + "self_attn.k_proj.weight": linear(kv, h),
              p + "self_attn.v_proj.weight": linear(kv, h), p + "self_attn.o_proj.weight": linear(h, h),
              p + "mlp.gate_proj.weight": linear(inter, h), p + "mlp.up_proj.weight": linear(inter, h),
              p + "mlp.down_proj.weight": linear(h, inter),
              p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
              p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
              "eos_token_id": 2, "torch_dtype": str(dtype).removeprefix("torch."), **shape}
    (path / "config.json").write_text(json.dumps(config))
    save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})


def engine_kwargs(device: torch.device, dtype: torch.dtype, max_num_seqs: int) -> dict:
    memory = dict(gpu_memory_utilization=0.5) if device.type == "cuda" else dict(kv_memory_gib=0.5)
    return dict(dtype=str(dtype).removeprefix("torch."), device=device.type, max_model_len=4096,
                max_num_seqs=max_num_seqs, **memory)


class IterationBench:
    """Runs hand-built iterations straight on the engine's runner (no scheduler), on fresh KV blocks."""

    def __init__(self, llm: LLM, device: torch.device):
        self.runner, self.device = llm.engine.runner, device
        self.block_size = llm.engine.config.cache.block_size
        self.num_blocks = llm.engine.num_total_blocks
        self.next_block = 0

    def table(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // self.block_size)
        if self.next_block + n > self.num_blocks:  # wrap around: the cache holds no real requests
            self.next_block = 0
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    def decodes(self, batch: int, context: int) -> list[ScheduledUnit]:
        return [ScheduledUnit(f"d{i}", [5], context, False, True, self.table(context + 1), GREEDY)
                for i in range(batch)]

    def prefill(self, num_tokens: int) -> ScheduledUnit:
        return ScheduledUnit("p", [5] * num_tokens, 0, True, True, self.table(num_tokens), GREEDY)

    def seconds(self, units: list[ScheduledUnit], repeats: int) -> float:
        return timed(lambda: self.runner.execute_model(SchedulerOutput(units)), self.device, repeats)


def iteration_figures(llm: LLM, device: torch.device, limits: dict, smoke: bool) -> dict:
    bench, repeats, context = IterationBench(llm, device), 3 if smoke else 10, 64 if smoke else 1024
    model = llm.engine.runner.model
    cfg = model.cfg
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)
    linear_params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "norm" not in n)
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * model.lm_head.weight.element_size()
    out: dict = {"weight_bytes": weight_bytes, "decode_context": context}
    for batch in (1, 8, 64, 128):
        seconds = bench.seconds(bench.decodes(batch, context), repeats)
        moved = weight_bytes + batch * (context + 1) * kv_bytes_per_token
        out[f"decode_b{batch}_s"] = seconds
        out[f"decode_b{batch}_mbu"] = moved / seconds / (limits["copy_gb_s"] * 1e9)
    lm_head = model.lm_head.weight.numel()
    for tokens in (512, 4096):
        seconds = bench.seconds([bench.prefill(tokens)], repeats)
        attention = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * tokens  # causal QK^T + PV
        flops = 2 * (linear_params - lm_head) * tokens + 2 * lm_head + attention
        out[f"prefill_{tokens}_s"] = seconds
        out[f"prefill_{tokens}_mfu"] = flops / seconds / (limits["matmul_tflops"] * 1e12)
    out["hybrid_512_plus_64_decodes_s"] = bench.seconds([*bench.decodes(64, context), bench.prefill(512)], repeats)
    out["hybrid_over_prefill_512"] = out["hybrid_512_plus_64_decodes_s"] / out["prefill_512_s"]
    return out


def offline_run(llm: LLM, prompts: list[list[int]], max_tokens: int, device: torch.device) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if device.type == "cuda"
                else contextlib.nullcontext())
    with profiler as prof:
        sync(device)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        sync(device)
        elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == max_tokens for o in outs)
    result = {"output_tok_s": len(prompts) * max_tokens / elapsed, "seconds": elapsed}
    if prof is not None:  # kernels run one at a time on the one stream: their summed time is the busy time
        busy_us = sum(e.self_device_time_total for e in prof.key_averages())
        result["gpu_busy_fraction"] = busy_us / 1e6 / elapsed
    return result


def hf_continuous_batching(path: Path, prompts: list[list[int]], max_tokens: int, device: torch.device,
                           dtype: torch.dtype) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if not hasattr(model, "generate_batch"):
        return {"skipped": "the installed transformers has no generate_batch"}
    model.generation_config.eos_token_id = None  # ignore_eos, as the engine runs
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generate_batch(prompts[:2], generation_config=GenerationConfig(max_new_tokens=4, do_sample=False))
    sync(device)
    start = time.perf_counter()
    outs = model.generate_batch(prompts, generation_config=config)
    sync(device)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.generated_tokens) for o in outs.values())
    return {"output_tok_s": generated / elapsed, "seconds": elapsed, "generated_tokens": generated}


def device_name(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and workload (checks the script on CPU)")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/gpu_<device>.json; smoke: a temp file)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SMOKE if args.smoke else MISTRAL_7B
    num_requests, prompt_len, max_tokens = (8, 64, 8) if args.smoke else (128, 1024, 128)
    result: dict = {"device": device_name(device), "dtype": str(dtype), "smoke": args.smoke, "shape": shape,
                    "workload": {"num_requests": num_requests, "prompt_len": prompt_len, "max_tokens": max_tokens}}
    result["limits"] = limits_figures(device, dtype, args.smoke)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, shape["vocab_size"], (num_requests, prompt_len), generator=g).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        write_checkpoint(shape, path, device, dtype)
        kwargs = engine_kwargs(device, dtype, max_num_seqs=128)
        llm = LLM(str(path), scheduler="sarathi", chunk_size=512, **kwargs)
        result["attention_backend"] = type(llm.engine.runner.attn_backend).__name__
        result["iterations"] = iteration_figures(llm, device, result["limits"], args.smoke)
        result["offline_sarathi_512"] = offline_run(llm, prompts, max_tokens, device)
        del llm
        llm = LLM(str(path), scheduler="vllm", max_num_batched_tokens=4096, **kwargs)
        result["offline_vllm"] = offline_run(llm, prompts, max_tokens, device)
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["offline_hf_continuous_batching"] = hf_continuous_batching(path, prompts, max_tokens, device, dtype)
    out = Path(args.out or (Path(tempfile.gettempdir()) / f"gpu_{result['device']}_smoke.json" if args.smoke
                            else f"benchmarks/results/gpu_{result['device']}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
