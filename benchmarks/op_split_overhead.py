"""What the sampled operator split costs (model.op_split_every, engine/utilization/op_split.py).

The offline workload of engine_throughput.py (default 16 x 512 prompt / 64 output, ``small``, sarathi-512) on
one engine, in alternating rounds with the split off and sampled every Nth iteration: the throughput ratio
(target: sampling slows a run by < 2%). Also how far a sampled iteration's time (linear + attention + other)
is from the median unsampled iteration of the same shape (decode-only iterations of the same batch size, and
prefill-only chunks of the same size) in the sampled rounds (target: within 5%).

    python -m benchmarks.op_split_overhead [--every 16] [--rounds 3]
"""
from __future__ import annotations

import statistics
import time

from benchmarks.engine_throughput import make_prompts, workload_parser, write_result
from engine import LLM, SamplingParams


def timed_run(llm: LLM, prompts: list[list[int]], max_tokens: int, every: int) -> tuple[float, list]:
    llm.engine.runner.split_sampler.every = every
    llm.engine.batch_records.clear()
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return len(prompts) * max_tokens / (time.perf_counter() - start), list(llm.engine.batch_records)


def split_vs_unsampled(records: list) -> list[float]:
    """Per shape with both: median sampled iteration time / median unsampled iteration time."""
    def shape(r):
        return (r.num_prefill_tokens, r.num_decode_seqs, r.num_prefill_seqs)
    ratios = []
    for key in {shape(r) for r in records if r.linear_s is not None}:
        same = [r for r in records if shape(r) == key]
        sampled = [r.linear_s + r.attention_s + r.other_s for r in same if r.linear_s is not None]
        plain = [r.end_time - r.start_time for r in same if r.linear_s is None]
        if len(plain) >= 3:
            ratios.append(statistics.median(sampled) / statistics.median(plain))
    return ratios


def main() -> None:
    ap = workload_parser(__doc__, "benchmarks/results/op_split_overhead.json")
    ap.set_defaults(num_requests=16, max_tokens=64)
    ap.add_argument("--every", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, scheduler="sarathi", chunk_size=512)
    prompts = make_prompts(args.num_requests, args.prompt_len, llm.engine.vocab_size)
    timed_run(llm, prompts[:2], 4, 0)  # warm-up
    off, on, shapes = [], [], []
    for r in range(args.rounds):
        for every in ((0, args.every) if r % 2 == 0 else (args.every, 0)):
            rate, records = timed_run(llm, prompts, args.max_tokens, every)
            (on if every else off).append(rate)
            if every:
                shapes += split_vs_unsampled(records)
    result = {"model": args.model, "every": args.every, "rounds": args.rounds, "num_requests": args.num_requests,
              "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "tok_s_off": off, "tok_s_sampled": on,
              "slowdown": 1 - statistics.median(on) / statistics.median(off),
              "sampled_over_unsampled_median": statistics.median(shapes) if shapes else None,
              "sampled_over_unsampled_shapes": len(shapes),
              "note": "measured on a shared machine: other processes load the CPU"}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
