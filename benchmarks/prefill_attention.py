"""Prefill attention on CPU: the native paged kernel (``cpu_paged``) vs the SDPA path, and the layer stack.

Shapes of preset ``small`` (12 heads, 4 KV heads, head_dim 64, block 16). Each case is a batch of
sequences (queries, cached context); both backends run it through their own ``__call__`` (cache write
included) on caches filled with the context first. Attention FLOPs count the visible (causal) pairs
only: 4 * heads * head_dim per query-key pair. The layer stack runs the whole model on one 512-token
chunk after 1500 cached tokens (matmuls + attention + element-wise work; logits of its last token).
Rates are the median (and best) of ``--repeats`` timings, each over ``--calls`` calls: the machine may
be shared, so the median is the figure to quote. The fp32/bf16 matmul peak is the best of its trials.
On a busy shared machine, ``--threads 1 --clock cpu`` times everything in the process's CPU time
instead of wall time, which other processes barely disturb (with more threads it would count idle
OpenMP spinning too).

    python -m benchmarks.prefill_attention [--dtype float32] [--threads N] [--clock wall|cpu] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.engine_throughput import linear_param_counts, write_result
from stallfree.engine.attention import make_attention_backend
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.loader import load_model
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.batch_prep import prepare_host_batch, to_device
from stallfree.engine.scheduler.output import ScheduledUnit
from stallfree.engine.utilization.measured_limits import measure_matmul_flops

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 12, 4, 64, 16
CASES = {  # name: [(queries, context) per sequence]
    "chunk512_ctx1500": [(512, 1500)],
    "chunk128_ctx1500": [(128, 1500)],
    "chunk512_ctx0": [(512, 0)],
    "decode32_ctx600": [(1, 600)] * 32,
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def rates(work: float, fn, repeats: int, calls: int, clock) -> tuple[float, float]:
    """``work`` per second of ``fn``: (median, best) over ``repeats`` timings of ``calls`` calls each."""
    fn()
    samples = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        samples.append(work * calls / (clock() - start))
    return statistics.median(samples), max(samples)


def paged_meta(seqs: list[tuple[int, int]], *, fill_context: bool = False):
    """Device metadata for each sequence's chunk of queries after its context, or with ``fill_context``
    for its context tokens alone (as fresh prefills); sequences own consecutive blocks."""
    units, first_block = [], 0
    for i, (queries, context) in enumerate(seqs):
        num_blocks = -(-(queries + context) // BLOCK_SIZE)
        table = list(range(first_block, first_block + num_blocks))
        first_block += num_blocks
        start, end = (0, context) if fill_context else (context, context + queries)
        if end > start:
            units.append(ScheduledUnit(f"s{i}", [3] * (end - start), start, fill_context or queries > 1, True,
                                       table, SamplingParams()))
    return to_device(prepare_host_batch(units, BLOCK_SIZE), torch.device("cpu")), first_block


def attention_flops(seqs: list[tuple[int, int]], heads: int, head_dim: int) -> float:
    pairs = sum(q * c + q * (q + 1) // 2 for q, c in seqs)
    return 4.0 * heads * head_dim * pairs


def bench_attention(backend_name: str, seqs, dtype: torch.dtype, repeats: int, calls: int,
                    clock) -> tuple[float, float]:
    backend = make_attention_backend(backend_name, torch.device("cpu"), dtype, num_heads=HEADS,
                                     num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, scale=HEAD_DIM ** -0.5)
    (_, _, step_meta, _), num_blocks = paged_meta(seqs)
    caches = [torch.zeros(backend.kv_cache_shape(num_blocks, BLOCK_SIZE), dtype=dtype) for _ in range(2)]
    g = torch.Generator().manual_seed(0)

    def qkv(num_tokens):  # as the model passes them: q and k fresh from the rotary, v a view of the projection
        x = torch.randn(num_tokens, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g).to(dtype)
        return x[:, :HEADS].contiguous(), x[:, HEADS:HEADS + KV_HEADS].contiguous(), x[:, HEADS + KV_HEADS:]

    if any(c for _, c in seqs):  # fill the context through the backend itself (its own cache layout)
        (_, _, context_meta, _), _ = paged_meta(seqs, fill_context=True)
        backend(*qkv(sum(c for _, c in seqs)), *caches, context_meta)
    step = qkv(sum(q for q, _ in seqs))
    flops = attention_flops(seqs, HEADS, HEAD_DIM)
    return rates(flops, lambda: backend(*step, *caches, step_meta), repeats, calls, clock)


def bench_layer_stack(backend_name: str, dtype: torch.dtype, repeats: int, clock, queries: int = 512,
                      context: int = 1500) -> dict:
    """The model's forward pass on one chunk after ``context`` cached tokens: seconds and FLOP/s."""
    path = resolve_model_path("small")
    arch = ArchConfig.from_dir(path)
    model = load_model(path, arch, 4096, dtype, torch.device("cpu"))
    backend = make_attention_backend(backend_name, torch.device("cpu"), dtype, num_heads=arch.num_heads,
                                     num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                                     scale=arch.head_dim ** -0.5)
    seqs = [(queries, context)]
    (ids, positions, step_meta, logits_indices), num_blocks = paged_meta(seqs)
    shape = backend.kv_cache_shape(num_blocks, BLOCK_SIZE)
    kv_caches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(arch.num_layers)]
    with torch.inference_mode():
        (c_ids, c_positions, c_meta, c_logits), _ = paged_meta(seqs, fill_context=True)
        model(c_ids, c_positions, backend, kv_caches, c_meta, c_logits)
        # From the shapes, not the parameters: packed linears (oneDNN's layout) hold no weight parameter.
        linear, lm_head = linear_param_counts(arch)
        flops = (2.0 * (linear - lm_head) * queries + 2.0 * lm_head
                 + arch.num_layers * attention_flops(seqs, arch.num_heads, arch.head_dim))
        median, best = rates(flops, lambda: model(ids, positions, backend, kv_caches, step_meta, logits_indices),
                             repeats, 1, clock)
    return {"seconds_median": flops / median, "flops_median": median, "flops_best": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3, help="kernel calls per timing")
    ap.add_argument("--backends", default="cpu_paged,sdpa")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--clock", default="wall", choices=sorted(CLOCKS))
    ap.add_argument("--out", default="benchmarks/results/prefill_attention.json")
    args = ap.parse_args()
    dtype, clock = getattr(torch, args.dtype), CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    backends = args.backends.split(",")
    result: dict = {"dtype": args.dtype, "threads": args.threads, "clock": args.clock, "repeats": args.repeats,
                    "matmul_flops_peak": measure_matmul_flops(dtype, clock=clock)}
    for name, seqs in CASES.items():
        for backend in backends:
            median, best = bench_attention(backend, seqs, dtype, args.repeats, args.calls, clock)
            result[f"{name}_{backend}_gflops_median"] = median / 1e9
            result[f"{name}_{backend}_gflops_best"] = best / 1e9
    for backend in backends:
        stack = bench_layer_stack(backend, dtype, args.repeats, clock)
        result[f"layer_stack_{backend}_seconds_median"] = stack["seconds_median"]
        result[f"layer_stack_{backend}_frac_of_peak_median"] = stack["flops_median"] / result["matmul_flops_peak"]
        result[f"layer_stack_{backend}_frac_of_peak_best"] = stack["flops_best"] / result["matmul_flops_peak"]
    result["matmul_flops_peak_end"] = measure_matmul_flops(dtype, clock=clock)  # the load may change meanwhile
    write_result(result, args.out)


if __name__ == "__main__":
    main()
