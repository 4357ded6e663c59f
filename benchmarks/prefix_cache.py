"""Automatic prefix caching on against off (``cache.enable_prefix_caching``), each measurement in a fresh
process, on and off alternating:

* ``shared``: 8 prefixes of 1,024 tokens, each request one of them (in turn) plus 64 tokens of its own, 32
  output tokens, sent one at a time (low load): TTFT p50 off / on, and the hit rate (prompt tokens taken from
  the cache / prompt tokens) against the workload's ideal (every request after a prefix's first takes its
  1,024 tokens from the cache);
* ``random``: offline throughput on prompts without reuse (32 x 512 / 128), on / off.

    python -m benchmarks.prefix_cache [--model small] [--pairs 2] [--out benchmarks/results/prefix_cache.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

NUM_PREFIXES, PREFIX_LEN, SUFFIX_LEN, OUTPUT_LEN = 8, 1024, 64, 32


def shared_prefix_prompts(num_requests: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(PREFIX_LEN)] for _ in range(NUM_PREFIXES)]
    return [prefixes[i % NUM_PREFIXES] + [rng.randrange(3, vocab) for _ in range(SUFFIX_LEN)]
            for i in range(num_requests)]


def ideal_hit_rate(num_requests: int) -> float:
    repeats = max(0, num_requests - NUM_PREFIXES)
    return repeats * PREFIX_LEN / (num_requests * (PREFIX_LEN + SUFFIX_LEN))


def measure_shared(model: str, caching: bool, num_requests: int) -> dict:
    from stallfree.engine import LLM, SamplingParams

    llm = LLM(model, scheduler="sarathi", chunk_size=512, enable_prefix_caching=caching)
    engine, params = llm.engine, SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0, ignore_eos=True)
    llm.generate([list(range(10, 300))], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    engine.reset_prefix_cache()
    ttfts, cached, prompt_tokens = [], [], 0
    for i, prompt in enumerate(shared_prefix_prompts(num_requests, engine.vocab_size)):
        engine.add_request(prompt, params, request_id=f"r{i}")
        while engine.has_unfinished():
            for out in engine.step(finished_only=True):
                ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
                cached.append(out.metrics.num_cached_tokens)
        prompt_tokens += len(prompt)
    return {"ttft_s": ttfts, "cached_tokens": cached, "hit_rate": sum(cached) / prompt_tokens,
            "ttft_p50_s": statistics.median(ttfts)}


def measure_random(model: str, caching: bool) -> dict:
    from benchmarks.engine_throughput import make_prompts, run_engine

    prompts = make_prompts(32, 512, 32000)
    tok_s, llm = run_engine(model, "sarathi", prompts, 128, "auto", chunk_size=512, enable_prefix_caching=caching)
    return {"output_tok_s": tok_s, "cached_tokens": llm.engine.kv.num_hit_tokens}


def in_fresh_process(mode: str, model: str, caching: bool, num_requests: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.prefix_cache", "--child", mode, "--model", model,
               "--num-requests", str(num_requests)] + (["--caching"] if caching else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--modes", default="shared,random")
    ap.add_argument("--out", default="benchmarks/results/prefix_cache.json")
    ap.add_argument("--child", choices=["shared", "random"], help=argparse.SUPPRESS)
    ap.add_argument("--caching", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = (measure_shared(args.model, args.caching, args.num_requests) if args.child == "shared"
                  else measure_random(args.model, args.caching))
        print(json.dumps(result))
        return
    report = {"model": args.model, "pairs": args.pairs, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "workload": {"prefixes": NUM_PREFIXES, "prefix_len": PREFIX_LEN, "suffix_len": SUFFIX_LEN,
                           "output_len": OUTPUT_LEN, "num_requests": args.num_requests,
                           "ideal_hit_rate": ideal_hit_rate(args.num_requests)}}
    for mode in args.modes.split(","):
        rounds = []
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)  # alternate which goes first
            runs = {caching: in_fresh_process(mode, args.model, caching, args.num_requests) for caching in order}
            off, on = runs[False], runs[True]
            if mode == "shared":
                rounds.append({"ttft_p50_off_over_on": off["ttft_p50_s"] / on["ttft_p50_s"],
                               "hit_rate_on": on["hit_rate"], "hit_rate_off": off["hit_rate"],
                               "ttft_p50_s": {"off": off["ttft_p50_s"], "on": on["ttft_p50_s"]}})
            else:
                rounds.append({"throughput_on_over_off": on["output_tok_s"] / off["output_tok_s"],
                               "output_tok_s": {"off": off["output_tok_s"], "on": on["output_tok_s"]},
                               "cached_tokens_on": on["cached_tokens"]})
            print(mode, json.dumps(rounds[-1]), flush=True)
        report[mode] = rounds
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
