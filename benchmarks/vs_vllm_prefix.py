"""stallfree-serve against vLLM's CPU build, both with their prefix caches on, on a prefix-reuse workload.

``--workload agentic`` (or ``chat``): the bench's session workload of that name (conf/workload/), each turn
resending its session's history, a follow-up sent its think time after the turn before it ended, ``--qps``
sessions per second. Otherwise agent-like traffic: ``--prefixes`` long system prompts of ``--prefix-len`` tokens, each request one of them
plus ``--suffix-len`` tokens of its own and ``--output-len`` output tokens (``workload=shared_prefix``), sent
open loop at Poisson times (``--qps``) to each server in turn, both up, each round once the other has gone
quiet, new prompts each round. Same model directory, dtype, chunk size (512), KV budget and KV block size
(``--block-size``) on both. Per round: TTFT p50 / p90 (from each request's scheduled send), output tokens/s,
and each server's prefix-cache hit rate from its own /metrics counters (vLLM's names), beside the rate the
workload gives an unbounded cache.

    python -m benchmarks.vs_vllm_prefix --peer PATH/TO/vllm_cpu.sh [--model small] [--qps 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import urllib.request
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.engine_throughput import write_result
from benchmarks.server_overhead import start_server
from benchmarks.vs_vllm_cpu import cpu_seconds, start_vllm, wait_until_quiet
from stallfree.engine.device import choose_dtype
from stallfree.engine.hydra_config import CONF_DIR
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.targets.server_vocabulary import read_page
from stallfree.loadgen.workload.prefix_reuse import ideal_hit_rate
from stallfree.loadgen.workload.request_specs import build_workload


def prefix_counters(url: str) -> tuple[float, float]:
    """(prompt tokens looked up, found) in the server's prefix cache so far, from its /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        samples = {s.metric: s.value for s in read_page(response.read().decode()).samples}
    return samples.get("prefix_cache_queries_total", 0.0), samples.get("prefix_cache_hits_total", 0.0)


def run_round(name: str, url: str, model: str, specs, idle_pid: int) -> dict:
    settle_s = wait_until_quiet(idle_pid)
    idle_before, (queries, hits) = cpu_seconds(idle_pid), prefix_counters(url)
    rows = run_open_loop_sync(url, specs, model=model, timeout_s=600)
    failed = [r for r in rows if r.status != "ok"]
    assert not failed, failed[0]
    queries_after, hits_after = prefix_counters(url)
    ttft = sorted(r.first_token_time - r.intended_send_time for r in rows)
    duration = max(r.finish_time for r in rows) - min(r.intended_send_time for r in rows)
    return {"server": name, "ttft_p50_s": statistics.median(ttft), "ttft_p90_s": statistics.quantiles(ttft, n=10)[8],
            "output_tok_s": sum(r.output_tokens for r in rows) / duration,
            "hit_rate": (hits_after - hits) / (queries_after - queries) if queries_after > queries else None,
            "cached_tokens": sum(r.cached_tokens or 0 for r in rows),
            "idle_peer_cpu_s": cpu_seconds(idle_pid) - idle_before, "idle_peer_settle_s": settle_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="script that serves vLLM's CPU build: PEER serve DIR PORT ...")
    ap.add_argument("--model", default="small")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--qps", type=float, default=3.0)
    ap.add_argument("--num-requests", type=int, default=96)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--workload", default="shared_prefix", choices=["shared_prefix", "agentic", "chat"],
                    help="agentic / chat: the bench's session workloads (conf/workload/), --qps in sessions/s")
    ap.add_argument("--block-size", type=int, default=32, help="KV block size of both servers (vLLM's CPU build: 32)")
    ap.add_argument("--kv-gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/vs_vllm_prefix.json")
    args = ap.parse_args()
    model_dir = resolve_model_path(args.model)
    dtype = choose_dtype(args.dtype, torch.device("cpu")).name
    vocab_size = ArchConfig.from_dir(model_dir).vocab_size
    lengths = {"kind": "shared_prefix", "num_prefixes": args.prefixes, "prefix_len": args.prefix_len,
               "suffix_len": args.suffix_len, "output_len": args.output_len}
    max_total_tokens = None
    if args.workload != "shared_prefix":
        preset = OmegaConf.load(CONF_DIR / "workload" / f"{args.workload}.yaml")
        lengths, max_total_tokens = OmegaConf.to_container(preset.lengths), preset.max_total_tokens
    result: dict = {**vars(args), "dtype": dtype, "chunk": 512, "rounds": []}
    log = Path(args.out).with_suffix(".vllm.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    ours = start_server(args.model, 8134, 512, f"model.dtype={dtype}", f"cache.kv_memory_gib={args.kv_gib}",
                        f"cache.block_size={args.block_size}", "cache.enable_prefix_caching=true")
    peer = None
    try:
        peer = start_vllm(args.peer, model_dir, 8135, 512, dtype, args.kv_gib, log,
                          "--enable-prefix-caching", "--block-size", str(args.block_size))
        for i in range(args.rounds):
            specs = build_workload({"kind": "poisson", "qps": args.qps}, lengths, args.num_requests, 100 + i,
                                   vocab_size, max_total_tokens)
            ideal = ideal_hit_rate([s.prompt_token_ids for s in specs], args.block_size)
            order = [("stallfree", "http://127.0.0.1:8134", args.model, peer.pid),
                     ("vllm", "http://127.0.0.1:8135", str(model_dir), ours.pid)]
            for name, url, model, idle_pid in order if i % 2 == 0 else order[::-1]:
                result["rounds"].append(run_round(name, url, model, specs, idle_pid) | {"ideal_hit_rate": ideal})
                print(result["rounds"][-1], flush=True)
    finally:
        for server in (ours, peer):
            if server is not None:
                server.stop(60)
    for server in ("stallfree", "vllm"):
        mine = [r for r in result["rounds"] if r["server"] == server]
        for key in ("ttft_p50_s", "ttft_p90_s", "output_tok_s"):
            result[f"{server}_{key}"] = statistics.median(r[key] for r in mine)
    pairs = [(a, b) if a["server"] == "stallfree" else (b, a)
             for a, b in zip(result["rounds"][::2], result["rounds"][1::2], strict=True)]
    result["ttft_p50_vllm_over_stallfree"] = [v["ttft_p50_s"] / s["ttft_p50_s"] for s, v in pairs]
    result["ttft_p90_vllm_over_stallfree"] = [v["ttft_p90_s"] / s["ttft_p90_s"] for s, v in pairs]
    write_result(result, args.out)


if __name__ == "__main__":
    main()
