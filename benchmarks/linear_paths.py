"""CPU linears in the engine, two arms in fresh processes, alternating which goes first:

* ``tiled`` against ``onednn`` (the default): bf16 on the tiled kernel's best path for this CPU
  (engine/model/tiled_linear.py: AMX or AVX512-BF16) against oneDNN's packed kernel (``PackedLinear``);
* ``widened`` against ``fp32`` (``--arms widened,fp32``): ``model.dtype=bfloat16`` as a CPU without native bf16
  runs it (bf16 weights widened to fp32 in the kernel, engine/model/widened_linear.py; forced here by hiding the
  CPU's native bf16) against the model in fp32.

Each process builds ``--model`` (chunked prefills, chunk 512) and reads its iteration records: the median decode
step at batch 1 (one request) and at batch ``--batch`` (``--batch`` x ``--prompt-len`` prompts admitted
together), and the median 512-token prefill chunk. Each round gives the ratios second arm / first arm (above 1:
the first is faster); the result holds every round and the median and range of each ratio. Batch-1 decode is
also given as a fraction of the machine's measured read bandwidth (weight bytes read per step / step time /
bandwidth).

    python -m benchmarks.linear_paths [--arms tiled,onednn] [--rounds 3] [--out benchmarks/results/linear_paths.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.engine_throughput import write_result

ARMS = ("tiled", "onednn", "widened", "fp32")
CHILD = """
import json, statistics, sys
import torch
from benchmarks.engine_throughput import make_prompts
from stallfree.engine import LLM, SamplingParams, device
from stallfree.engine.model import tiled_linear
from stallfree.engine.utilization import machine_limits
arm, model, batch, prompt_len, max_tokens = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
if arm == "onednn":
    tiled_linear.fast_path_available = lambda: False
if arm == "widened":
    device.cpu_has_fast_bf16 = lambda: False
llm = LLM(model, dtype="float32" if arm == "fp32" else "bfloat16", scheduler="sarathi", chunk_size=512)
path = llm.engine.linear_kernels
greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
vocab = llm.engine.runner.model.lm_head.out_features
llm.generate(make_prompts(2, 16, vocab, seed=1), SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
def median_step(prompts, prefill=0, decode=0):
    llm.engine.batch_records.clear()
    llm.engine.reset_prefix_cache()
    llm.generate(prompts, greedy)
    return statistics.median(r.end_time - r.start_time for r in llm.engine.batch_records
                             if r.num_prefill_tokens == prefill and r.num_decode_seqs == decode)
prompts = make_prompts(batch, prompt_len, vocab)
out = {"path": path, "decode_b1_s": median_step(prompts[:1], decode=1),
       "decode_batch_s": median_step(prompts, decode=batch), "prefill_512_s": median_step(prompts[:4], prefill=512)}
limits = machine_limits(torch.device("cpu"), torch.bfloat16)
weight_bytes = llm.engine.utilization.counts.weight_bytes
out["decode_b1_frac_of_bandwidth"] = weight_bytes / out["decode_b1_s"] / limits.bandwidth
print(json.dumps(out))
"""


def run(arm: str, args: argparse.Namespace) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, arm, args.model, str(args.batch), str(args.prompt_len),
                           str(args.max_tokens)], capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        sys.exit(f"the {arm} arm failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arms", default="tiled,onednn", help="two of " + ", ".join(ARMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/linear_paths.json")
    args = ap.parse_args()
    pair = tuple(args.arms.split(","))
    if len(pair) != 2 or not set(pair) <= set(ARMS):
        ap.error(f"--arms: two of {', '.join(ARMS)}, got {args.arms!r}")
    first, second = pair
    rounds = []
    for i in range(args.rounds):
        order = pair if i % 2 == 0 else pair[::-1]
        arms = {arm: run(arm, args) for arm in order}
        ratios = {f"{key}_{second}_over_{first}": arms[second][key] / arms[first][key]
                  for key in ("decode_b1_s", "decode_batch_s", "prefill_512_s")}
        rounds.append({**arms, **ratios})
        print(f"round {i}: " + "  ".join(f"{key} {value:.3f}" for key, value in ratios.items()), flush=True)
    result: dict = {"model": args.model, "arms": list(pair), "batch": args.batch, "prompt_len": args.prompt_len,
                    "max_tokens": args.max_tokens, "linear_kernels": {arm: rounds[0][arm]["path"] for arm in pair},
                    "rounds": rounds}
    for key in rounds[0]:
        if key.endswith(f"_{second}_over_{first}"):
            values = [r[key] for r in rounds]
            result[f"median_{key}"], result[f"range_{key}"] = statistics.median(values), [min(values), max(values)]
    for arm in pair:
        result[f"{arm}_decode_b1_frac_of_bandwidth"] = statistics.median(
            r[arm]["decode_b1_frac_of_bandwidth"] for r in rounds)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
