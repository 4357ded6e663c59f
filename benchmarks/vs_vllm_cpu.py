"""stallfree-serve vs vLLM's CPU build, side by side.

The same burst as the engine benchmark (32 x 512 prompt / 128 output tokens, ignore_eos, streamed
over HTTP) against each server in turn, on the same materialized preset directory, both in the same
dtype (``--dtype auto``: bf16 where the CPU has native bf16 matmuls, else fp32) with a chunked-prefill
budget of 512 tokens per iteration and the same KV cache budget (``--kv-gib``, vLLM's
VLLM_CPU_KVCACHE_SPACE). vLLM's engine is bound to all cores (by default it reserves one for its front
end), as stallfree's uses them all. ``--peer`` is a script that installs and serves
vLLM's CPU build (``PEER setup``, then ``PEER serve MODEL_DIR PORT [vLLM args]``); run its setup first.

    python -m benchmarks.vs_vllm_cpu --peer PATH/TO/vllm_cpu.sh [--model small|smollm2] [--dtype auto]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import torch

from benchmarks.engine_throughput import make_prompts, workload_parser, write_result
from benchmarks.server_overhead import measure_burst, start_server
from engine.device import resolve_dtype
from engine.model.arch import ArchConfig
from engine.model.presets import resolve_model_path
from loadgen.records import RequestRecord


def start_vllm(peer: str, model_dir: Path, port: int, chunk: int, dtype: str, kv_gib: float,
               log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["bash", peer, "serve", str(model_dir), str(port), "--enable-chunked-prefill",
                             "--max-num-batched-tokens", str(chunk), "--dtype", dtype],
                            env=os.environ | {"VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
                                              "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                                              "VLLM_CPU_KVCACHE_SPACE": f"{kv_gib:g}"},
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"vLLM did not become ready; see {log}")


def latency(rows: list[RequestRecord]) -> dict:
    ttft = [r.first_token_time - r.send_time for r in rows]
    itl = [b - a for r in rows for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    return {"median_ttft_ms": 1000 * statistics.median(ttft), "median_itl_ms": 1000 * statistics.median(itl),
            "p99_itl_ms": 1000 * statistics.quantiles(itl, n=100)[98]}


def main() -> None:
    ap = workload_parser(__doc__, "benchmarks/results/vs_vllm_cpu.json")
    ap.add_argument("--peer", required=True, help="script that serves vLLM's CPU build: PEER serve DIR PORT ...")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--kv-gib", type=float, default=4.0, help="KV cache budget of both servers, GiB")
    args = ap.parse_args()
    model_dir = resolve_model_path(args.model)
    dtype = str(resolve_dtype(args.dtype, torch.device("cpu"))).removeprefix("torch.")
    prompts = make_prompts(args.num_requests, args.prompt_len, ArchConfig.from_dir(model_dir).vocab_size)
    result: dict = {"model": args.model, "dtype": dtype, "num_requests": args.num_requests,
                    "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "chunk": args.chunk,
                    "kv_gib": args.kv_gib}

    proc = start_server(args.model, 8124, args.chunk, f"model.dtype={dtype}", f"model.kv_memory_gib={args.kv_gib}")
    try:
        result["stallfree_tok_s"], rows = measure_burst("http://127.0.0.1:8124", args.model, prompts,
                                                        args.max_tokens)
        result |= {f"stallfree_{k}": v for k, v in latency(rows).items()}
    finally:
        proc.terminate()
        proc.wait(30)

    log = Path(args.out).with_suffix(".vllm.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_vllm(args.peer, model_dir, 8125, args.chunk, dtype, args.kv_gib, log)
    try:
        result["vllm_tok_s"], rows = measure_burst("http://127.0.0.1:8125", str(model_dir), prompts,
                                                   args.max_tokens)
        result |= {f"vllm_{k}": v for k, v in latency(rows).items()}
    finally:
        proc.terminate()
        proc.wait(60)
    result["ratio_stallfree_vs_vllm"] = result["stallfree_tok_s"] / result["vllm_tok_s"]
    write_result(result, args.out)


if __name__ == "__main__":
    main()
