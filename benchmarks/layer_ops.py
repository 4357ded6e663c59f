"""Native layer ops vs PyTorch's element-wise ops, in process, on one model: median iteration time of a
512-token prefill chunk and of a decode step at batch 32 (short contexts), with the CPU kernels of
engine/native/csrc/layer_ops.cpp and with the PyTorch modules they replace. Engines alternate, ``--rounds`` each.

    python -m benchmarks.layer_ops [--model smollm2] [--rounds 2] [--out benchmarks/results/layer_ops.json]
"""
from __future__ import annotations

import argparse
import random
import statistics

from benchmarks.engine_throughput import write_result
from stallfree.engine import LLM, SamplingParams
from stallfree.engine.model import loader


def make_llm(model: str, native: bool) -> LLM:
    use_native = loader.can_use_native_ops
    if not native:
        loader.can_use_native_ops = lambda device, dtype: False
    try:
        return LLM(model, scheduler="sarathi", chunk_size=512, dtype="float32")
    finally:
        loader.can_use_native_ops = use_native


def median_iteration_s(llm: LLM, prompts: list[list[int]], max_tokens: int, decode_only: bool) -> float:
    llm.engine.batch_records.clear()
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return statistics.median(r.end_time - r.start_time for r in llm.engine.batch_records
                             if not decode_only or r.num_prefill_tokens == 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/layer_ops.json")
    args = ap.parse_args()
    rng = random.Random(0)
    prefills = [[rng.randrange(100, 30000) for _ in range(512)] for _ in range(6)]
    decodes = [[rng.randrange(100, 30000) for _ in range(16)] for _ in range(32)]
    engines = {"native": make_llm(args.model, True), "pytorch": make_llm(args.model, False)}
    times: dict[str, dict[str, list[float]]] = {name: {"prefill_512_s": [], "decode_32_s": []} for name in engines}
    for llm in engines.values():  # warm-up
        llm.generate(prefills[:2], SamplingParams(max_tokens=2, temperature=0.0))
    for _ in range(args.rounds):
        for name, llm in engines.items():
            times[name]["prefill_512_s"].append(median_iteration_s(llm, prefills, 1, decode_only=False))
            times[name]["decode_32_s"].append(median_iteration_s(llm, decodes, 40, decode_only=True))
    result: dict = {"model": args.model, "dtype": "float32", "rounds": times}
    for key in ("prefill_512_s", "decode_32_s"):
        for name in engines:
            result[f"{name}_{key}"] = statistics.median(times[name][key])
        result[f"speedup_{key}"] = result[f"pytorch_{key}"] / result[f"native_{key}"]
    write_result(result, args.out)


if __name__ == "__main__":
    main()
