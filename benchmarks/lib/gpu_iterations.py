"""Parts of ``benchmarks/gpu.py``: iterations built by hand and run straight on the engine's runner, timed,
with their MBU and MFU against the machine's limits."""
from __future__ import annotations

import time

import torch

from stallfree.engine import LLM, SamplingParams
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput

GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def parameter_counts(cfg) -> tuple[int, int]:
    """(parameters of the linears below the LM head, of the LM head), from the architecture: packed CPU
    linears hold no ``weight`` tensor to count."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_layers * per_layer, cfg.vocab_size * cfg.hidden_size


class IterationBench:
    """Runs hand-built iterations straight on the engine's runner (no scheduler), on fresh KV blocks."""

    def __init__(self, llm: LLM, device: torch.device):
        self.runner, self.device = llm.engine.runner, device
        self.block_size = llm.engine.config.cache.block_size
        self.num_blocks = llm.engine.num_total_blocks
        self.next_block = 0

    def table(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // self.block_size)
        if self.next_block + n > self.num_blocks:  # wrap around: the cache holds no real requests
            self.next_block = 0
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    def decodes(self, batch: int, context: int) -> list[ScheduledUnit]:
        return [ScheduledUnit(f"d{i}", [5], context, False, True, self.table(context + 1), GREEDY)
                for i in range(batch)]

    def prefill(self, num_tokens: int) -> ScheduledUnit:
        return ScheduledUnit("p", [5] * num_tokens, 0, True, True, self.table(num_tokens), GREEDY)

    def seconds(self, units: list[ScheduledUnit], repeats: int) -> float:
        return timed(lambda: self.runner.execute_model(SchedulerOutput(units)), self.device, repeats)


def iteration_figures(llm: LLM, device: torch.device, limits: dict, smoke: bool) -> dict:
    bench, repeats, context = IterationBench(llm, device), 3 if smoke else 10, 64 if smoke else 1024
    cfg, element = llm.engine.runner.model.cfg, torch.empty((), dtype=llm.engine.dtype).element_size()
    below_head, lm_head = parameter_counts(cfg)
    weight_bytes = (below_head + lm_head) * element
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * element
    out: dict = {"weight_bytes": weight_bytes, "decode_context": context}
    for batch in (1, 8, 64, 128):
        seconds = bench.seconds(bench.decodes(batch, context), repeats)
        moved = weight_bytes + batch * (context + 1) * kv_bytes_per_token
        out[f"decode_b{batch}_ms"] = seconds * 1e3
        out[f"decode_b{batch}_mbu"] = moved / seconds / (limits["read_gb_s"] * 1e9)
    for tokens in (512, 4096):
        seconds = bench.seconds([bench.prefill(tokens)], repeats)
        attention = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * tokens  # causal QK^T + PV
        flops = 2 * below_head * tokens + 2 * lm_head + attention
        out[f"prefill_{tokens}_ms"] = seconds * 1e3
        out[f"prefill_{tokens}_mfu"] = flops / seconds / (limits["matmul_tflops"] * 1e12)
    hybrid = bench.seconds([*bench.decodes(64, context), bench.prefill(512)], repeats)
    out["hybrid_512_plus_64_decodes_ms"] = hybrid * 1e3
    out["hybrid_over_prefill_512"] = out["hybrid_512_plus_64_decodes_ms"] / out["prefill_512_ms"]
    return out
