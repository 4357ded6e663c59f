"""A/B of the engine's step time between two source trees (e.g. a change and the commit before it),
interleaved so that a shared machine's load falls on both alike.

Each round runs one short subprocess per tree, alternating which goes first: a greedy workload
(``--num-requests`` prompts of ``--prompt-len`` tokens, ``--max-tokens`` each, all admitted at once)
on ``--model`` with ``--threads`` torch threads, timing the process CPU time of every ``engine.step()``
call from the outside (schedule, run, update, outputs): CPU time, not wall time, so that time the
process spends descheduled on a loaded machine does not count.
A round's figure is the median decode-step time; the result is the median over rounds of the
per-round ratio B / A, so a load change between rounds cancels out.

    python -m benchmarks.ab_step_time /tmp/base . --rounds 6 --out benchmarks/results/ab_step_time.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, statistics, sys, time
import torch
from stallfree.engine import LLM, SamplingParams
model, dtype, n, prompt_len, max_tokens, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
torch.set_num_threads(threads)
llm = LLM(model, dtype=dtype, scheduler="sarathi", chunk_size=512)
engine = llm.engine
params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
llm.generate([[5 + i] * 8 for i in range(2)], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
for i in range(n):
    engine.add_request([3 + (7 * i + j) % 2000 for j in range(prompt_len)], params)
decodes = []
while engine.has_unfinished():
    records = len(engine.batch_records)
    start = time.process_time()
    engine.step()
    elapsed = time.process_time() - start
    if len(engine.batch_records) > records and engine.batch_records[-1].num_prefill_tokens == 0:
        decodes.append(elapsed)
print(json.dumps({"median_decode_step_s": statistics.median(decodes), "steps": len(decodes)}))
"""


def run(tree: Path, args: argparse.Namespace) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, args.model, args.dtype, str(args.num_requests),
                          str(args.prompt_len), str(args.max_tokens), str(args.threads)], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median_decode_step_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="source tree A (the baseline)")
    ap.add_argument("b", type=Path, help="source tree B")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    # One thread: on a loaded machine a descheduled OpenMP worker stalls every parallel region of the
    # others, which swamps the Python-side cost an A/B of the step path is after.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/ab_step_time.json")
    args = ap.parse_args()
    rounds = []
    for i in range(args.rounds):
        order = [("a", args.a), ("b", args.b)] if i % 2 == 0 else [("b", args.b), ("a", args.a)]
        times = {name: run(tree.resolve(), args) for name, tree in order}
        rounds.append(times | {"ratio_b_over_a": times["b"] / times["a"]})
        print(f"round {i}: A {times['a'] * 1e3:.2f} ms  B {times['b'] * 1e3:.2f} ms  B/A {times['b'] / times['a']:.3f}")
    ratios = [r["ratio_b_over_a"] for r in rounds]
    result = {"a": str(args.a), "b": str(args.b), "model": args.model, "dtype": args.dtype, "threads": args.threads,
              "num_requests": args.num_requests, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "rounds": rounds, "median_ratio_b_over_a": statistics.median(ratios),
              "min_ratio": min(ratios), "max_ratio": max(ratios)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"median B/A {result['median_ratio_b_over_a']:.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
