"""First-run acceptance of the GPU engine: one command, PASS or FAIL per target, one JSON (<= 5 min on an H200).

1. Greedy equality with HF transformers on the device first: a small random model with the 7B's
   attention layout (GQA 4:1, head_dim 128) in fp32, through the whole serving path (triton attention,
   fused Triton layer ops, decode CUDA graphs); in bf16 the agreement is recorded, not judged.
2. A Mistral-7B-shaped random bf16 checkpoint: the attention backend, whether the decode graphs were
   captured (at startup, before any timing) and replayed, the KV cache sizing; machine limits (bf16
   matmul TFLOP/s, copy GB/s); decode iterations at batch 1/8/64/128 with MBU; prefill-only 512 and
   4096 with MFU; a hybrid iteration (a 512 chunk with 64 decodes) against prefill-only 512; the
   offline workload 128 x 1024 prompt / 128 output (greedy, ignore_eos) for sarathi-512 and vllm,
   timed without the profiler (a short profiled run after gives the GPU's busy fraction); the same
   workload through HF transformers' continuous batching (``generate_batch``).
   On 2+ GPUs, TP2 greedy tokens against TP1 and PP2 against PP1, with PP2's bubble fraction under sarathi
   and vllm (NCCL, benchmarks/lib/gpu_parallel.py); skipped, and the JSON's ``tp2_vs_tp1`` /
   ``pp2_vs_pp1`` and the output say so, on fewer.
3. PASS / FAIL against each target (benchmarks/lib/gpu_checks.py: decode <= 6 ms at batch 1 and <= 9 ms
   at 64, hybrid <= 1.3x prefill-only 512, MFU >= 0.5 at 512 and >= 0.65 at 4096, offline sarathi
   >= 0.9x vllm and >= 2x HF continuous batching); exit status 0 only when everything passed.

    python -m benchmarks.gpu            # writes benchmarks/results/gpu_<device>.json
    python -m benchmarks.gpu --smoke    # tiny shapes on whatever device there is (CI runs it on CPU:
                                        # the same code path, figures not judged, exit 0 if HF-equal)
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.lib.gpu_checks import CHECK_SHAPE, SMOKE_SHAPE, greedy_check, judge, write_checkpoint
from benchmarks.lib.gpu_diagnosis import diagnose
from benchmarks.lib.gpu_iterations import iteration_figures, sync
from benchmarks.lib.gpu_parallel import pp2_check, tp2_check, verdict
from stallfree.engine import LLM, SamplingParams
from stallfree.engine.model.presets import SHAPE_PRESETS
from stallfree.engine.utilization import machine_limits
from stallfree.engine.utilization.measured_limits import measure_bandwidth, measure_matmul_flops

MISTRAL_7B = SHAPE_PRESETS["mistral-7b-shape"]
GPU_MEMORY_UTILIZATION = 0.85  # an HF model and a second engine come and go in the same process


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def limits_figures(device: torch.device, dtype: torch.dtype, smoke: bool) -> dict:
    """The machine limits (engine/utilization/measured_limits.py; a full run refreshes the engine's cached figures)."""
    if smoke:
        flops, bandwidth = measure_matmul_flops(dtype, device, n=1024), measure_bandwidth(device, dtype, num_bytes=1 << 24)
    else:
        limits = machine_limits(device, dtype, refresh=True)
        flops, bandwidth = limits.peak_flops, limits.bandwidth
    return {"matmul_tflops": flops / 1e12, "read_gb_s": bandwidth / 1e9}


def engine_kwargs(device: torch.device, dtype: torch.dtype) -> dict:
    memory = (dict(gpu_memory_utilization=GPU_MEMORY_UTILIZATION) if device.type == "cuda"
              else dict(kv_memory_gib=0.25))
    return dict(dtype=str(dtype).removeprefix("torch."), device=device.type, **memory)


def offline_run(llm: LLM, prompts: list[list[int]], max_tokens: int, device: torch.device) -> dict:
    """Timed without the profiler; then a short profiled run for the GPU's busy fraction."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    sync(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(device)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == max_tokens for o in outs)
    result = {"output_tok_s": len(prompts) * max_tokens / elapsed, "seconds": elapsed}
    if device.type == "cuda":  # kernels run one at a time on the one stream: their summed time is the busy time
        few = prompts[:16]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            llm.generate(few, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
            sync(device)
            profiled = time.perf_counter() - start
        busy_us = sum(e.self_device_time_total for e in prof.key_averages())
        result["gpu_busy_fraction_16_requests"] = busy_us / 1e6 / profiled
    return result


def hf_continuous_batching(path: Path, prompts: list[list[int]], max_tokens: int, device: torch.device,
                           dtype: torch.dtype, smoke: bool) -> dict:
    """HF's own defaults on the GPU; a small paged cache in the smoke run (sized from free memory, HF's
    cache filled a CPU machine's RAM and took minutes)."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if not hasattr(model, "generate_batch"):
        return {"skipped": "the installed transformers has no generate_batch"}
    cb = dict(continuous_batching_config=transformers.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256)
              ) if smoke else {}
    model.generation_config.eos_token_id = None  # ignore_eos, as the engine runs
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generate_batch(prompts[:2], generation_config=GenerationConfig(max_new_tokens=4, do_sample=False), **cb)
    sync(device)
    start = time.perf_counter()
    outs = model.generate_batch(prompts, generation_config=config, **cb)
    sync(device)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.generated_tokens) for o in outs.values())
    return {"output_tok_s": generated / elapsed, "seconds": elapsed, "generated_tokens": generated}


def serving_path(llm: LLM) -> dict:
    """What the engine actually runs: attention backend, fused layer ops, decode graphs, KV sizing."""
    runner = llm.engine.runner
    graphs = runner.decode_graphs
    profile = runner.memory_profile
    return {"attention_backend": type(runner.attn_backend).__name__,
            "layer_ops": type(runner.model.layers[0].input_layernorm).__name__,
            "cuda_graphs": None if graphs is None else {
                "buckets": graphs.buckets, "capture_seconds": graphs.capture_seconds,
                "replays": dict(graphs.replays)},
            "kv_blocks": runner.num_blocks,
            "kv_sizing_gib": None if profile is None else {
                **{k: v / 2**30 for k, v in vars(profile).items()}, "utilization": GPU_MEMORY_UTILIZATION,
                # to compare with (1 - utilization) x total: what the sizing meant to leave free
                "free_after_runs": torch.cuda.mem_get_info(llm.engine.device)[0] / 2**30}}


def device_name(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def ratio(a: dict, b: dict) -> float | None:
    return a["output_tok_s"] / b["output_tok_s"] if "output_tok_s" in a and "output_tok_s" in b else None


def prompts_of(shape: dict, num_requests: int, prompt_len: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, shape["vocab_size"], (num_requests, prompt_len), generator=g).tolist()


def measure(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, shape: dict,
            workload: tuple[int, int, int], result: dict, stage) -> None:
    """Every figure of the run into ``result``, calling ``stage(name)`` after each stage."""
    num_requests, prompt_len, max_tokens = workload
    prompts = prompts_of(shape, num_requests, prompt_len)
    with tempfile.TemporaryDirectory() as tmp:
        check_path = write_checkpoint(SMOKE_SHAPE if args.smoke else CHECK_SHAPE, Path(tmp) / "check", device,
                                      torch.float32)
        check = dict(device=device.type, num_blocks=256)  # a small cache: the 7B engine below sizes its own
        result["greedy_vs_hf"] = greedy_check(check_path, device, torch.float32, dict(check, dtype="float32"))
        print(f"greedy vs HF (fp32): {'PASS' if result['greedy_vs_hf']['equal'] else 'FAIL'}", flush=True)
        if device.type == "cuda":
            result["greedy_vs_hf_bf16"] = greedy_check(check_path, device, torch.bfloat16,
                                                       dict(check, dtype="bfloat16"))
        stage("greedy_vs_hf")
        result["tp2_vs_tp1"] = tp2_check(check_path, device, dict(check, dtype="float32"))  # 2+ GPUs only
        print(f"TP2 vs TP1 greedy (fp32): {verdict(result['tp2_vs_tp1'])}", flush=True)
        stage("tp2_vs_tp1")
        result["pp2_vs_pp1"] = pp2_check(check_path, device, dict(check, dtype="float32"))  # 2+ GPUs only
        bubbles = result["pp2_vs_pp1"].get("bubble_fraction")
        print(f"PP2 vs PP1 greedy (fp32): {verdict(result['pp2_vs_pp1'])}"
              + (f"; PP2 bubble fraction {bubbles}" if bubbles else ""), flush=True)
        stage("pp2_vs_pp1")
        release(device)
        result["limits"] = limits_figures(device, dtype, args.smoke)
        stage("limits")
        path = write_checkpoint(shape, Path(tmp) / "model", device, dtype)
        stage("checkpoint")
        llm = LLM(str(path), scheduler="sarathi", chunk_size=512, max_model_len=4096, max_num_seqs=128,
                  **engine_kwargs(device, dtype))
        stage("engine_startup")
        result["iterations"] = iteration_figures(llm, device, result["limits"], args.smoke)
        stage("iterations")
        result["offline_sarathi_512"] = offline_run(llm, prompts, max_tokens, device)
        stage("offline_sarathi")
        result["serving_path"] = serving_path(llm)  # after the runs: the graph replays they made
        print(f"attention backend: {result['serving_path']['attention_backend']}; CUDA graphs: "
              f"{result['serving_path']['cuda_graphs']}", flush=True)
        del llm
        release(device)
        llm = LLM(str(path), scheduler="vllm", max_num_batched_tokens=4096, max_model_len=4096, max_num_seqs=128,
                  **engine_kwargs(device, dtype))
        result["offline_vllm"] = offline_run(llm, prompts, max_tokens, device)
        del llm
        release(device)
        stage("offline_vllm")
        result["offline_hf_continuous_batching"] = hf_continuous_batching(path, prompts, max_tokens, device, dtype,
                                                                           args.smoke)
    stage("offline_hf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and workload (the same path; CI runs it on CPU)")
    ap.add_argument("--diagnose", action="store_true",
                    help="only where the offline run's time goes (benchmarks/lib/gpu_diagnosis.py; --smoke runs it on the CPU)")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/gpu_<device>.json; smoke: a temp file)")
    args = ap.parse_args()
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = SMOKE_SHAPE if args.smoke else MISTRAL_7B
    num_requests, prompt_len, max_tokens = (8, 64, 8) if args.smoke else (128, 1024, 128)
    result: dict = {"device": device_name(device), "dtype": str(dtype), "smoke": args.smoke, "shape": shape,
                    "torch": torch.__version__,
                    "workload": {"num_requests": num_requests, "prompt_len": prompt_len, "max_tokens": max_tokens}}
    stages = result["stage_seconds"] = {}  # seconds since the start at the end of each stage: the 5-minute budget
    out = Path(args.out or (Path(tempfile.gettempdir()) / f"gpu_{result['device']}_smoke.json" if args.smoke
                            else f"benchmarks/results/gpu_{result['device']}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)

    def stage(name: str) -> None:  # the JSON so far is on disk after every stage: a later failure keeps it
        stages[name] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(result, indent=2))

    try:
        if args.diagnose:
            with tempfile.TemporaryDirectory() as tmp:
                path = write_checkpoint(shape, Path(tmp) / "model", device, dtype)
                result["diagnosis"] = diagnose(str(path), prompts_of(shape, num_requests, prompt_len), max_tokens,
                                               engine_kwargs(device, dtype))
            stage("diagnosis")
            raise SystemExit(0)
        measure(args, device, dtype, shape, (num_requests, prompt_len, max_tokens), result, stage)
    except Exception:  # noqa: BLE001 - a device run is rare: keep what was measured and say where it broke
        result["error"] = traceback.format_exc()
        result["verdict"] = "FAIL"
        stage("failed")
        print(result["error"], f"FAIL: kept the figures measured before it in {out}", sep="\n")
        raise SystemExit(1) from None

    figures = {**result["iterations"],
               "offline_sarathi_over_vllm": ratio(result["offline_sarathi_512"], result["offline_vllm"]),
               "offline_sarathi_over_hf_continuous_batching": ratio(result["offline_sarathi_512"],
                                                                    result["offline_hf_continuous_batching"])}
    result["targets"] = judge(figures)
    result["seconds"] = time.perf_counter() - started
    passed = result["greedy_vs_hf"]["equal"] and result["tp2_vs_tp1"].get("equal", True) and (
        args.smoke or all(t["verdict"] == "PASS" for t in result["targets"].values()))
    result["verdict"] = "PASS" if passed else "FAIL"
    out.write_text(json.dumps(result, indent=2))
    print(("smoke run: the targets are GPU targets, shown but not judged\n" if args.smoke else "")
          + "\n".join(f"{t['verdict']:4}  {name} = {t['value']} (target {t['target']})"
                      for name, t in result["targets"].items()))
    print(f"{result['verdict']} in {result['seconds']:.0f} s; wrote {out}")
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()
