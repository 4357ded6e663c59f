"""Server overhead: the engine benchmark's workload through HTTP (streaming) vs in-process LLM.generate.

Reports the output tokens/s ratio HTTP / in-process (target >= 0.9) and the TTFT the HTTP path adds
at low load (sequential single requests: client-side TTFT minus the engine's own TTFT).

    python -m benchmarks.server_overhead [--model small] [--out benchmarks/results/server_overhead.json]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.engine_throughput import make_prompts, run_engine, workload_parser, write_result
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.targets.server_process import ServerProcess


def start_server(model: str, port: int, chunk_size: int, *overrides: str) -> ServerProcess:
    """A stallfree-serve of ``model`` (sarathi at ``chunk_size``) on 127.0.0.1:``port``, answering."""
    command = [os.path.join(os.path.dirname(sys.executable), "stallfree-serve"), f"model={model}",
               "scheduler=sarathi", f"scheduler.chunk_size={chunk_size}", f"port={port}", *overrides]
    log = Path(tempfile.gettempdir()) / f"stallfree-serve-{port}.log"
    return ServerProcess(command, f"http://127.0.0.1:{port}", log).start()


def measure_burst(url: str, model: str, prompts: list[list[int]],
                  max_tokens: int) -> tuple[float, list[RequestRecord]]:
    """All requests at once, streamed (after one short warm-up request): output tokens/s and the rows."""
    run_open_loop_sync(url, [RequestSpec("warm", 0.0, prompts[0][:16], 4)], model=model, timeout_s=600)
    specs = [RequestSpec(f"r{i}", 0.0, p, max_tokens) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    rows = run_open_loop_sync(url, specs, model=model, timeout_s=1200)
    elapsed = time.perf_counter() - start
    assert all(r.status == "ok" and r.output_tokens == max_tokens for r in rows), rows[0]
    return len(rows) * max_tokens / elapsed, rows


def main() -> None:
    ap = workload_parser(__doc__, "benchmarks/results/server_overhead.json")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    prompts = make_prompts(args.num_requests, args.prompt_len,
                           ArchConfig.from_dir(resolve_model_path(args.model)).vocab_size)
    result: dict = {"model": args.model, "num_requests": args.num_requests, "prompt_len": args.prompt_len,
                    "max_tokens": args.max_tokens}

    tput, llm = run_engine(args.model, "sarathi", prompts, args.max_tokens, "auto", chunk_size=512)
    result["inprocess_tok_s"] = tput
    engine_ttfts = []
    for prompt in prompts[:5]:
        out = llm.generate([prompt], None)[0]
        engine_ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
    del llm

    proc = start_server(args.model, args.port, 512)
    try:
        url = f"http://127.0.0.1:{args.port}"
        result["http_tok_s"], _ = measure_burst(url, args.model, prompts, args.max_tokens)
        http_ttfts, server_ttfts = [], []
        for i, prompt in enumerate(prompts[:5]):
            row = run_open_loop_sync(url, [RequestSpec(f"s{i}", 0.0, prompt, 16)], model=args.model,
                                     timeout_s=600)[0]
            http_ttfts.append(row.first_token_time - row.send_time)
            server_ttfts.append(row.server_token_times[0] - row.server_arrival_time)
    finally:
        proc.stop()
    result["ratio_http_vs_inprocess"] = result["http_tok_s"] / result["inprocess_tok_s"]
    result["ttft_inprocess_ms_p50"] = 1000 * statistics.median(engine_ttfts)
    result["ttft_http_ms_p50"] = 1000 * statistics.median(http_ttfts)
    result["ttft_added_vs_inprocess_ms_p50"] = result["ttft_http_ms_p50"] - result["ttft_inprocess_ms_p50"]
    result["ttft_added_vs_server_engine_ms_p50"] = 1000 * statistics.median(
        h - s for h, s in zip(http_ttfts, server_ttfts, strict=True))
    write_result(result, args.out)

if __name__ == "__main__":
    main()
