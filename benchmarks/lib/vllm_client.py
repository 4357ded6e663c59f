"""vLLM's own benchmark client (``vllm bench serve``, run through its Python API from the peer's venv) as
benchmarks/vs_vllm_client.py drives it: its timed_trace workload, the wrapper that captures the requests
it expands and its CPU time, its per-request results as RequestRecords, and the start-time handshake
with which a second client starts its schedule at the same instant."""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from stallfree.engine.records import RequestRecord
from stallfree.loadgen.workload.request_specs import poisson

ABORTED = "aborted"  # the start file when vLLM's client failed before writing its start
HASH_BLOCK = 16  # vLLM's --timed-trace-chunk-hash-size: tokens per hash id
# vLLM's benchmark client, as `vllm bench serve` runs it, with its requests captured and its CPU time
# and start of schedule recorded (the sidecar JSON, argv[1]).
# argv[2] is "-", "capture" (write the expanded requests and stop: no benchmark), or a start file: the
# client then writes the perf_counter time its schedule will start at (1 s ahead) there, for the other
# client of a run at once, and waits for it.
VLLM_CLIENT = r'''
import argparse, asyncio, json, os, resource, sys, time
from vllm.benchmarks import serve
sidecar, start_file, info = sys.argv[1], sys.argv[2], {}
get_samples, get_request, benchmark = serve.get_samples, serve.get_request, serve.benchmark
def cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
def captured_samples(*args, **kwargs):
    samples = get_samples(*args, **kwargs)
    info["requests"] = [[s.prompt, s.timestamp, s.expected_output_len] for s in samples]
    if start_file == "capture":
        json.dump(info, open(sidecar, "w"))
        sys.exit(0)
    return samples
async def timed_get_request(*args, **kwargs):
    if start_file not in ("-", "capture"):
        start = time.perf_counter() + 1.0
        with open(start_file + ".tmp", "w") as f:
            f.write(repr(start))
        os.replace(start_file + ".tmp", start_file)
        await asyncio.sleep(start - time.perf_counter())
    info["schedule_start"], info["cpu_start_s"] = time.perf_counter(), cpu_s()
    async for item in get_request(*args, **kwargs):
        yield item
async def timed_benchmark(*args, **kwargs):
    result = await benchmark(*args, **kwargs)
    info["cpu_s"] = cpu_s() - info["cpu_start_s"]
    return result
serve.get_samples, serve.get_request, serve.benchmark = captured_samples, timed_get_request, timed_benchmark
parser = argparse.ArgumentParser()
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[3:]))
json.dump(info, open(sidecar, "w"))
'''


def write_trace(path: Path, n: int, qps: float, prompt_len: int, output_len: int, seed: int) -> None:
    """vLLM's timed_trace JSONL: Poisson send offsets (loadgen's arrival process), unique hash ids."""
    offsets = poisson(np.random.default_rng(seed), n, qps)
    blocks = math.ceil(prompt_len / HASH_BLOCK)
    path.write_text("".join(json.dumps({"timestamp": float(t), "input_length": prompt_len,
                                        "output_length": output_len,
                                        "hash_ids": list(range(i * blocks, (i + 1) * blocks))}) + "\n"
                            for i, t in enumerate(offsets)))


def write_subset(trace: Path, indices: list[int], path: Path) -> Path:
    lines = trace.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[i] for i in indices))
    return path


def wait_for_start(start_file: Path, timeout_s: float = 600) -> None:
    """Sleep until the perf_counter time vLLM's client wrote to ``start_file`` (CLOCK_MONOTONIC on Linux,
    the same clock in every process)."""
    deadline = time.perf_counter() + timeout_s
    # An empty file is one being written (a plain write_text, as of ABORTED, is not atomic): read it again.
    while not (start := start_file.read_text() if start_file.exists() else ""):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"vLLM's client wrote no start time to {start_file}")
        time.sleep(0.001)
    if start == ABORTED:
        raise RuntimeError("vLLM's client failed before its schedule started")
    time.sleep(max(0.0, float(start) - time.perf_counter()))


def vllm_records(result: dict, info: dict) -> list[RequestRecord]:
    """vLLM's per-request timestamps (--save-detailed; perf_counter seconds) as RequestRecords."""
    records = []
    for i, (start, ttft, itl, latency, out, error) in enumerate(zip(
            result["start_times"], result["ttfts"], result["itls"], result["latencies"], result["output_lens"],
            result["errors"], strict=True)):
        first = start + ttft
        records.append(RequestRecord(
            request_id=f"vllm-{i}", status="error" if error else "ok", error=error or None, is_warmup=False,
            prompt_tokens=result["input_lens"][i], max_tokens=out, output_tokens=out,
            intended_send_time=info["schedule_start"] + info["requests"][i][1], send_time=start,
            first_token_time=first, finish_time=start + latency,
            token_times=[first, *(first + np.cumsum(itl)).tolist()]))
    return records


def start_vllm_client(python: Path, url: str, model: str, model_dir: Path, trace: Path, num_prompts: int, work: Path,
                      tag: str, start_file: str = "-") -> subprocess.Popen:
    """vLLM's client on ``python`` (the peer venv's; ``start_file``: see VLLM_CLIENT), started; its log,
    result and sidecar are named by ``tag`` in ``work``."""
    command = [str(python), "-c", VLLM_CLIENT, str(work / f"{tag}.info.json"), start_file,
               "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
               "--tokenizer", str(model_dir), "--dataset-name", "timed_trace", "--dataset-path", str(trace),
               "--num-prompts", str(num_prompts), "--temperature", "0", "--save-result",
               "--save-detailed", "--result-dir", str(work), "--result-filename", f"{tag}.json"]
    return subprocess.Popen(command, stdout=(work / f"{tag}.log").open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONHASHSEED": "0"})


def finish_vllm_client(proc: subprocess.Popen, work: Path, tag: str) -> dict:
    """Wait for vLLM's client; return its sidecar, with its ``records`` and ``result`` (its result file)
    unless it only captured requests."""
    if proc.wait() != 0:
        raise RuntimeError(f"vLLM's client exited with {proc.returncode}; see {work / f'{tag}.log'}")
    info = json.loads((work / f"{tag}.info.json").read_text())
    if "cpu_s" in info:
        result = json.loads((work / f"{tag}.json").read_text())
        info["records"], info["result"] = vllm_records(result, info), result
    return info
