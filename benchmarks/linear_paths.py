"""bf16 CPU linears in the engine: the tiled kernel on this CPU's best path (engine/model/tiled_linear.py: AMX or
AVX512-BF16) against oneDNN's packed kernel (``PackedLinear``), in fresh processes, alternating which goes first.

Each process builds ``--model`` in bf16 (chunked prefills, chunk 512) and reads its iteration records: the median
decode step at batch 1 (one request) and at batch ``--batch`` (``--batch`` x ``--prompt-len`` prompts admitted
together), and the median 512-token prefill chunk. Each round gives the ratios oneDNN / tiled (above 1: the tiled
kernel is faster); the result holds every round and the median and range of each ratio. Batch-1 decode is also
given as a fraction of the machine's measured read bandwidth (weights read per step / step time / bandwidth).

    python -m benchmarks.linear_paths [--rounds 3] [--out benchmarks/results/linear_paths.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.engine_throughput import write_result

ARMS = ("tiled", "onednn")
CHILD = """
import json, statistics, sys
import torch
from benchmarks.engine_throughput import linear_param_counts, make_prompts
from stallfree.engine import LLM, SamplingParams
from stallfree.engine.model import tiled_linear
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.utilization import machine_limits
arm, model, batch, prompt_len, max_tokens = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
if arm == "onednn":
    tiled_linear.fast_path_available = lambda: False
path = tiled_linear.linear_path() if arm == "tiled" else "onednn"
llm = LLM(model, dtype="bfloat16", scheduler="sarathi", chunk_size=512)
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
weights, _ = linear_param_counts(ArchConfig.from_dir(resolve_model_path(model)))
limits = machine_limits(torch.device("cpu"), torch.bfloat16)
out["decode_b1_frac_of_bandwidth"] = weights * 2 / out["decode_b1_s"] / limits.bandwidth
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/linear_paths.json")
    args = ap.parse_args()
    rounds = []
    for i in range(args.rounds):
        order = ARMS if i % 2 == 0 else ARMS[::-1]
        arms = {arm: run(arm, args) for arm in order}
        ratios = {f"{key}_onednn_over_tiled": arms["onednn"][key] / arms["tiled"][key]
                  for key in ("decode_b1_s", "decode_batch_s", "prefill_512_s")}
        rounds.append({**arms, **ratios})
        print(f"round {i}: " + "  ".join(f"{key} {value:.3f}" for key, value in ratios.items()), flush=True)
    result: dict = {"model": args.model, "dtype": "bfloat16", "batch": args.batch, "prompt_len": args.prompt_len,
                    "max_tokens": args.max_tokens, "tiled_path": rounds[0]["tiled"]["path"], "rounds": rounds}
    for key in rounds[0]:
        if key.endswith("_onednn_over_tiled"):
            values = [r[key] for r in rounds]
            result[f"median_{key}"], result[f"range_{key}"] = statistics.median(values), [min(values), max(values)]
    for arm in ARMS:
        result[f"{arm}_decode_b1_frac_of_bandwidth"] = statistics.median(
            r[arm]["decode_b1_frac_of_bandwidth"] for r in rounds)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
