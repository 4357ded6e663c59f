"""stallfree-serve vs vLLM's CPU build, side by side.

The same burst as the engine benchmark (32 x 512 prompt / 128 output tokens, ignore_eos, streamed
over HTTP) against each server in turn, on the same materialized preset directory, both in the same
dtype (``--dtype auto``: bf16 where the CPU has native bf16 matmuls, else fp32) with a chunked-prefill
budget of 512 tokens per iteration and the same KV cache budget (``--kv-gib``, vLLM's
VLLM_CPU_KVCACHE_SPACE). vLLM's engine is bound to all cores (by default it reserves one for its front
end), as stallfree's uses them all. Both servers stay up and take ``--rounds`` turns (stallfree, vLLM,
stallfree, ...), each once the other has gone quiet; the result has each round, the medians, and the CPU the
idle server used meanwhile. ``--peer`` is a script that installs and serves
vLLM's CPU build (``PEER setup``, then ``PEER serve MODEL_DIR PORT [vLLM args]``); run its setup first.

    python -m benchmarks.vs_vllm_cpu --peer PATH/TO/vllm_cpu.sh [--model small|smollm2] [--dtype auto]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from benchmarks.engine_throughput import make_prompts, workload_parser, write_result
from benchmarks.server_overhead import measure_burst, start_server
from stallfree.engine.device import choose_dtype
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.records import RequestRecord
from stallfree.loadgen.targets.server_process import ServerProcess


def start_vllm(peer: str, model_dir: Path, port: int, chunk: int, dtype: str, kv_gib: float,
               log: Path, *extra: str) -> ServerProcess:
    command = ["bash", peer, "serve", str(model_dir), str(port), "--enable-chunked-prefill",
               "--max-num-batched-tokens", str(chunk), "--dtype", dtype, *extra]
    env = os.environ | {"VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                        "VLLM_CPU_KVCACHE_SPACE": f"{kv_gib:g}"}
    return ServerProcess(command, f"http://127.0.0.1:{port}", log, env=env).start()


def latency(rows: list[RequestRecord]) -> dict:
    ttft = [r.first_token_time - r.send_time for r in rows]
    itl = [b - a for r in rows for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    return {"median_ttft_ms": 1000 * statistics.median(ttft), "median_itl_ms": 1000 * statistics.median(itl),
            "p99_itl_ms": 1000 * statistics.quantiles(itl, n=100)[98]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of process ``pid`` and its live descendants (/proc), in seconds."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone
        stats[int(entry.name)] = int(fields[1]), int(fields[11]) + int(fields[12])  # ppid, utime + stime
    tree = {pid}
    for _ in range(8):  # bash -> python -> engine core -> ...: a few levels deep
        tree |= {p for p, (ppid, _) in stats.items() if ppid in tree}
    ticks = sum(stats[p][1] for p in tree if p in stats)
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(pid: int, window_s: float = 0.5, max_share: float = 0.05, timeout_s: float = 30.0) -> float:
    """Wait until process ``pid``'s tree uses under ``max_share`` of a core over ``window_s``; returns the wait.

    A server that has just finished its burst can keep working for a while (vLLM's idle engine used about a
    CPU second of the next round without this), and that second would be charged to the other server."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        before = cpu_seconds(pid)
        time.sleep(window_s)
        if cpu_seconds(pid) - before < max_share * window_s:
            break
    return time.monotonic() - start


def run_round(name: str, url: str, model: str, prompts, max_tokens: int, idle: subprocess.Popen) -> dict:
    """One burst against ``url`` once the other (idle) server is quiet, with the CPU it used meanwhile."""
    settle_s = wait_until_quiet(idle.pid)
    idle_before = cpu_seconds(idle.pid)
    tok_s, rows = measure_burst(url, model, prompts, max_tokens)
    return {"server": name, "tok_s": tok_s, **latency(rows), "idle_peer_cpu_s": cpu_seconds(idle.pid) - idle_before,
            "idle_peer_settle_s": settle_s}


def main() -> None:
    ap = workload_parser(__doc__, "benchmarks/results/vs_vllm_cpu.json")
    ap.add_argument("--peer", required=True, help="script that serves vLLM's CPU build: PEER serve DIR PORT ...")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--kv-gib", type=float, default=4.0, help="KV cache budget of both servers, GiB")
    ap.add_argument("--rounds", type=int, default=2, help="bursts per server, alternating (new prompts each round)")
    args = ap.parse_args()
    model_dir = resolve_model_path(args.model)
    dtype = choose_dtype(args.dtype, torch.device("cpu")).name
    vocab_size = ArchConfig.from_dir(model_dir).vocab_size
    result: dict = {"model": args.model, "dtype": dtype, "num_requests": args.num_requests,
                    "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "chunk": args.chunk,
                    "kv_gib": args.kv_gib, "rounds": []}
    log = Path(args.out).with_suffix(".vllm.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    # Both servers stay up and take turns, so a slow spell of the machine falls on both; each round has
    # prompts of its own (vLLM caches prefixes, stallfree does not).
    ours = start_server(args.model, 8124, args.chunk, f"model.dtype={dtype}", f"cache.kv_memory_gib={args.kv_gib}")
    peer = None
    try:
        peer = start_vllm(args.peer, model_dir, 8125, args.chunk, dtype, args.kv_gib, log)
        for i in range(args.rounds):
            prompts = make_prompts(args.num_requests, args.prompt_len, vocab_size, seed=i)
            result["rounds"].append(run_round("stallfree", "http://127.0.0.1:8124", args.model, prompts,
                                              args.max_tokens, idle=peer))
            result["rounds"].append(run_round("vllm", "http://127.0.0.1:8125", str(model_dir), prompts,
                                              args.max_tokens, idle=ours))
            print(result["rounds"][-2:], flush=True)
    finally:
        for server in (ours, peer):
            if server is not None:
                server.stop(60)
    for server in ("stallfree", "vllm"):  # medians over the rounds
        mine = [r for r in result["rounds"] if r["server"] == server]
        for key in ("tok_s", "median_ttft_ms", "median_itl_ms", "p99_itl_ms"):
            result[f"{server}_{key}"] = statistics.median(r[key] for r in mine)
    result["ratio_stallfree_vs_vllm"] = result["stallfree_tok_s"] / result["vllm_tok_s"]
    result["ratio_per_round"] = [a["tok_s"] / b["tok_s"] for a, b in zip(result["rounds"][::2], result["rounds"][1::2],
                                                                         strict=True)]
    write_result(result, args.out)


if __name__ == "__main__":
    main()
