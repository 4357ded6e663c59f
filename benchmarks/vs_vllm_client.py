"""Cross-check of the load generator against vLLM's own benchmark client (``vllm bench serve``).

Both clients send the same requests at the same times, against stallfree-serve and against vLLM's CPU
server on the same materialized preset directory: vLLM's client replays a ``timed_trace`` dataset
(per-request timestamps, token-id prompts expanded from hash ids, ignore_eos), with PYTHONHASHSEED fixed
so every run expands the same prompts; its requests are captured from its own run and stallfree's
open-loop dispatcher (loadgen.openloop) replays exactly those, at the same offsets. ``--together``:
``no`` runs the clients in turn, ABBA order per server; the other two run both at once, their schedules
started at the same instant, so the machine's drift between runs reaches both alike. ``copies`` has each
client send every request (each prompt twice in all; the two copies usually share a server iteration,
and the per-request pairs show when they do not); ``halves`` has vLLM's client send the even-numbered
requests and ours the odd ones, then the other way round, so the server sees the workload once per run and
each client measures every request once per repeat. vLLM's server runs without prefix caching: the runs
resend the same prompts. Server ``simulated`` is a control: stallfree-serve with ``model.runner=simulated``,
whose iterations sleep the cost model's time, so the server hardly depends on the CPU the clients and
other processes leave it. Per run: the client's medians of TTFT (from the actual send), TPOT and ITL as vLLM
defines them, the client process's CPU time during the schedule (resource usage), its schedule lag, and
the server engine's CPU share (loadgen.cpu_share). vLLM's per-request timestamps are also summarized
by loadgen.metrics, which checks that the two define the metrics alike.

    python -m benchmarks.vs_vllm_client --peer-script PATH/vllm_cpu.sh [--peer-venv ~/.cache/vllm-cpu-venv]
    # benchmarks/results/vs_vllm_client.json: ... --servers simulated,stallfree,vllm --qps 0.5,4
    # benchmarks/results/vs_vllm_client_{copies,halves}.json: ... --qps 2 --num-requests 64 --together copies|halves

``--peer-script`` serves vLLM's CPU build (``PEER serve MODEL_DIR PORT [vLLM args]``); ``--peer-venv`` is
the venv it installed, whose Python runs vLLM's client.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from engine.model.presets import resolve_model_path
from loadgen.cpu_share import CpuMonitor, sample
from loadgen.metrics import summarize
from loadgen.openloop import run_open_loop_sync
from loadgen.records import RequestRecord
from loadgen.results import requests_frame
from loadgen.workload import RequestSpec, poisson

TOLERANCE = 0.05
SAME_STEP_MS = 10.0  # --together copies: the two copies of a request whose TTFTs differ less were served together
ABORTED = "aborted"  # a run at once: the start file when vLLM's client failed before writing its start
HASH_BLOCK = 16  # vLLM's --timed-trace-chunk-hash-size: tokens per hash id
# vLLM's summary keys -> loadgen.metrics summary keys of the same definition
SAME_METRIC = {"median_ttft_ms": "median_ttft_from_send_ms", "median_tpot_ms": "median_tpot_ms",
               "median_itl_ms": "median_itl_ms"}
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


def descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in descendants(c)]


def busiest_process(pid: int) -> int:
    """The process of the tree under ``pid`` that has used the most CPU (the engine: vLLM's worker)."""
    return max([pid, *descendants(pid)], key=lambda p: sample(p).engine_cpu_s)


def start_server(command: list[str], url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{command[0]} did not become ready; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def wait_for_start(start_file: Path, timeout_s: float = 600) -> None:
    """Sleep until the perf_counter time vLLM's client wrote to ``start_file`` (CLOCK_MONOTONIC on Linux,
    the same clock in every process)."""
    deadline = time.perf_counter() + timeout_s
    while not start_file.exists():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"vLLM's client wrote no start time to {start_file}")
        time.sleep(0.001)
    start = start_file.read_text()
    if start == ABORTED:
        raise RuntimeError("vLLM's client failed before its schedule started")
    time.sleep(max(0.0, float(start) - time.perf_counter()))


def run_stallfree_client(url: str, model: str, specs: list[RequestSpec],
                         start_file: Path | None = None) -> tuple[list[RequestRecord], float]:
    """In a child process of its own: the records and the CPU time the client used for the schedule.
    With ``start_file``, the schedule starts when vLLM's client starts its own."""
    if start_file is not None:
        wait_for_start(start_file)
    before = resource.getrusage(resource.RUSAGE_SELF)
    records = run_open_loop_sync(url, specs, model=model, timeout_s=900)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return records, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


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


def client_figures(records: list[RequestRecord], cpu_s: float) -> dict:
    frame = requests_frame(records)
    s = summarize(frame)
    done = frame[frame["status"] == "ok"]
    last_token = [(t[-1] - t[0]) * 1e3 / (len(t) - 1) for t in done["token_times"] if len(t) > 1]
    return {"completed": s["completed"], "failed": s["failed"],
            **{ours: s[ours] for ours in SAME_METRIC.values()}, "median_ttft_ms": s["median_ttft_ms"],
            "median_tpot_to_last_token_ms": statistics.median(last_token),
            "schedule_lag_p50_ms": s["schedule_lag_p50_ms"], "schedule_lag_p99_ms": s["schedule_lag_p99_ms"],
            "schedule_lag_max_ms": s["schedule_lag_max_ms"], "client_cpu_s": cpu_s,
            "client_cpu_ms_per_request": 1e3 * cpu_s / len(records)}


def vllm_client(args: argparse.Namespace, url: str, model_dir: Path, trace: Path, work: Path, tag: str,
                start_file: str = "-", num_prompts: int | None = None) -> subprocess.Popen:
    """vLLM's client (``start_file``: see VLLM_CLIENT), started; its log, result and sidecar are named by ``tag``."""
    command = [str(Path(args.peer_venv).expanduser() / "bin" / "python"), "-c", VLLM_CLIENT,
               str(work / f"{tag}.info.json"), start_file,
               "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", args.model,
               "--tokenizer", str(model_dir), "--dataset-name", "timed_trace", "--dataset-path", str(trace),
               "--num-prompts", str(num_prompts or args.num_requests), "--temperature", "0", "--save-result",
               "--save-detailed", "--result-dir", str(work), "--result-filename", f"{tag}.json"]
    return subprocess.Popen(command, stdout=(work / f"{tag}.log").open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONHASHSEED": "0"})


def finish_vllm_client(proc: subprocess.Popen, work: Path, tag: str) -> dict:
    """Wait for vLLM's client; return its sidecar, with its figures unless it only captured requests."""
    if proc.wait() != 0:
        raise RuntimeError(f"vLLM's client exited with {proc.returncode}; see {work / f'{tag}.log'}")
    info = json.loads((work / f"{tag}.info.json").read_text())
    if "cpu_s" in info:
        result = json.loads((work / f"{tag}.json").read_text())
        info["records"] = vllm_records(result, info)
        info["figures"] = {**client_figures(info["records"], info["cpu_s"]),
                           "vllm_reported": {key: result[key] for key in SAME_METRIC}}
    return info


def pair_figures(theirs: list[RequestRecord], ours: list[RequestRecord]) -> dict:
    """``--together copies``, request by request: the two copies' TTFTs (each from its own client's send). Copies
    whose first tokens came within ``SAME_STEP_MS`` came from the same server iteration."""
    pairs = [((a.first_token_time - a.send_time) * 1e3, (b.first_token_time - b.send_time) * 1e3)
             for a, b in zip(theirs, ours, strict=True) if a.status == b.status == "ok"]
    same = [(a, b) for a, b in pairs if abs(a - b) < SAME_STEP_MS]
    return {"pairs": len(pairs), "same_step_pairs": len(same),
            "vllm_copy_later_pairs": sum(a - b >= SAME_STEP_MS for a, b in pairs),
            "stallfree_copy_later_pairs": sum(b - a >= SAME_STEP_MS for a, b in pairs),
            "same_step_median_ttft_diff_ms": statistics.median(a - b for a, b in same) if same else None}


def replay_specs(requests: list) -> list[RequestSpec]:
    """The requests vLLM's client expanded, as the load generator's specs (same prompts, offsets, lengths)."""
    return [RequestSpec(f"r{j}", t, list(prompt), out) for j, (prompt, t, out) in enumerate(requests)]


def run_at_once(args: argparse.Namespace, url: str, model_dir: Path, work: Path, tag: str, trace: Path,
                num_prompts: int, our_specs: list[RequestSpec], pool: ProcessPoolExecutor) -> tuple[dict, list, float]:
    """Both clients at once, their schedules started at the same instant: vLLM's on ``trace``, ours on
    ``our_specs``. vLLM's sidecar (with its records), our records and our CPU seconds."""
    start_file = work / f"{tag}.start"
    theirs = vllm_client(args, url, model_dir, trace, work, tag, str(start_file), num_prompts)
    ours = pool.submit(run_stallfree_client, url, args.model, our_specs, start_file)
    try:
        info = finish_vllm_client(theirs, work, tag)
    finally:
        if not start_file.exists():  # vLLM's client failed before its schedule: release ours
            start_file.write_text(ABORTED)
    records, cpu_s = ours.result()
    # beside vLLM's per-request file, for a look request by request
    (work / f"{tag}.stallfree.json").write_text(json.dumps([dataclasses.asdict(r) for r in records]))
    return info, records, cpu_s


def write_subset(trace: Path, indices: list[int], path: Path) -> Path:
    lines = trace.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[i] for i in indices))
    return path


def measure_point(args: argparse.Namespace, name: str, engine_pid: int, url: str, model_dir: Path, qps: float, work: Path,
                  pool: ProcessPoolExecutor) -> list[dict]:
    """The runs of both clients at one rate, by ``--together`` (module docstring)."""
    trace = work / f"trace-{qps:g}.jsonl"
    write_trace(trace, args.num_requests, qps, args.prompt_len, args.max_tokens, args.seed)
    runs = []

    def record(client: str, i: int, figures: dict, monitor: CpuMonitor) -> None:
        server_cpu = monitor.report.as_summary() if monitor.report else {}
        runs.append({"server": name, "qps": qps, "client": client, "run": i, "together": args.together, **figures,
                     **{f"server_{k}": server_cpu.get(k) for k in ("engine_cpu_share", "others_cpu_share",
                                                                      "load_avg_1m", "wall_s", "disturbed")}})
        print(json.dumps({k: v for k, v in runs[-1].items() if not isinstance(v, dict)}), flush=True)

    def check(info: dict, expected: list) -> None:
        assert info["requests"] == expected, "vLLM's client expanded different prompts on a rerun"

    if args.together == "no":  # ABBA, vLLM's first: its run gives the requests stallfree replays
        order, requests = ["vllm", "stallfree", "stallfree", "vllm"] * math.ceil(args.repeats / 2), None
        for i, client in enumerate(order[:2 * args.repeats]):
            with CpuMonitor(engine_pid) as monitor:
                if client == "vllm":
                    tag = f"{name}-{qps:g}-{i}"
                    info = finish_vllm_client(vllm_client(args, url, model_dir, trace, work, tag), work, tag)
                    requests = requests or info["requests"]
                    check(info, requests)
                    figures = info["figures"]
                else:
                    figures = client_figures(*pool.submit(run_stallfree_client, url, args.model,
                                                          replay_specs(requests)).result())
            record(client, i, figures, monitor)
        return runs
    tag = f"{name}-{qps:g}-capture"
    requests = finish_vllm_client(vllm_client(args, url, model_dir, trace, work, tag, "capture"), work, tag)["requests"]
    specs = replay_specs(requests)
    n = len(specs)
    for i in range(args.repeats):
        tag = f"{name}-{qps:g}-{i}"
        with CpuMonitor(engine_pid) as monitor:
            if args.together == "copies":
                info, ours, our_cpu_s = run_at_once(args, url, model_dir, work, tag, trace, n, specs, pool)
                check(info, requests)
                theirs, their_cpu_s = info["records"], info["cpu_s"]
                extra = {"pairs": pair_figures(theirs, ours)}
            else:  # halves, swapped between the two runs
                theirs, ours, their_cpu_s, our_cpu_s = [], [], 0.0, 0.0
                for half in (0, 1):
                    their_part = list(range(half, n, 2))
                    our_part = list(range(1 - half, n, 2))
                    subset = write_subset(trace, their_part, work / f"{tag}-{half}.jsonl")
                    info, our_records, cpu_s = run_at_once(args, url, model_dir, work, f"{tag}-{half}", subset,
                                                           len(their_part), [specs[j] for j in our_part], pool)
                    check(info, [requests[j] for j in their_part])
                    theirs += info["records"]
                    ours += our_records
                    their_cpu_s += info["cpu_s"]
                    our_cpu_s += cpu_s
                extra = {}
        record("vllm", i, {**client_figures(theirs, their_cpu_s), **extra}, monitor)
        record("stallfree", i, {**client_figures(ours, our_cpu_s), **extra}, monitor)
    return runs


def measure_server(args: argparse.Namespace, name: str, proc: subprocess.Popen, url: str, model_dir: Path, work: Path) -> list[dict]:
    run_open_loop_sync(url, [RequestSpec(f"warm{i}", 0.0, list(range(5, 69)), 8) for i in range(4)],
                       model=args.model, timeout_s=600)
    engine_pid = busiest_process(proc.pid)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [run for qps in args.qps for run in measure_point(args, name, engine_pid, url, model_dir, qps,
                                                                 work, pool)]


def compare(runs: list[dict]) -> dict:
    """Per server and rate, per metric: each client's median over its runs, stallfree / vLLM, the 5% check."""
    out: dict = {}
    for point in sorted({(r["server"], r["qps"]) for r in runs}):
        def values(client: str, key: str, point: tuple = point) -> list[float]:
            return [r[key] for r in runs if (r["server"], r["qps"]) == point and r["client"] == client]

        def median_of(client: str, key: str) -> float:
            return statistics.median(values(client, key))
        entry = out.setdefault(f"{point[0]}@{point[1]:g}qps", {})
        for metric, key in SAME_METRIC.items():
            vllm, ours = median_of("vllm", key), median_of("stallfree", key)
            entry[metric] = {"vllm_client": vllm, "stallfree_client": ours, "ratio": ours / vllm,
                             "within_5pct": abs(ours / vllm - 1) <= TOLERANCE,
                             "runs": {"vllm_client": values("vllm", key), "stallfree_client": values("stallfree", key)}}
        # loadgen.metrics on vLLM's own timestamps against the medians vLLM reports: the definitions agree
        entry["definitions_max_rel_diff"] = max(
            (abs(r[ours] / r["vllm_reported"][theirs] - 1) for r in runs
             if (r["server"], r["qps"]) == point and "vllm_reported" in r for theirs, ours in SAME_METRIC.items()),
            default=None)
        paired = [r["pairs"] for r in runs if (r["server"], r["qps"]) == point and r["client"] == "vllm" and "pairs" in r]
        if paired:  # copies of a request served in different iterations: which client's copy came later
            entry["pairs"] = {key: sum(p[key] for p in paired) for key in
                              ("pairs", "same_step_pairs", "vllm_copy_later_pairs", "stallfree_copy_later_pairs")}
        entry["client_cpu_ms_per_request"] = {c: median_of(c, "client_cpu_ms_per_request") for c in ("vllm", "stallfree")}
        entry["server_engine_cpu_share"] = {c: median_of(c, "server_engine_cpu_share") for c in ("vllm", "stallfree")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-script", required=True, help="serves vLLM's CPU build: PEER serve DIR PORT ...")
    ap.add_argument("--peer-venv", default="~/.cache/vllm-cpu-venv", help="the venv with vLLM (its client)")
    ap.add_argument("--model", default="small")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--qps", default="4", help="request rates, comma-separated (Poisson arrivals)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="runs per client per server (ABBA order)")
    ap.add_argument("--together", default="no", choices=["no", "copies", "halves"],
                    help="no: the clients take turns (ABBA); copies: both at once, each sending every request; "
                         "halves: both at once, each sending every other request, swapped in a second run "
                         "(one repeat = both runs, figures over both)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", default="stallfree,vllm", help="any of stallfree, simulated, vllm")
    ap.add_argument("--cost-model", default="benchmarks/cost_models/small-cpu.json", help="for the simulated server")
    ap.add_argument("--out", default="benchmarks/results/vs_vllm_client.json")
    args = ap.parse_args()
    args.qps = [float(q) for q in args.qps.split(",")]
    model_dir = resolve_model_path(args.model)
    work = Path(tempfile.mkdtemp(prefix="vs_vllm_client-"))
    print(f"logs, traces and vLLM's result files: {work}", flush=True)
    stallfree = [str(Path(sys.executable).with_name("stallfree-serve")), f"model={args.model}", "model.dtype=float32",
                 "scheduler=sarathi", "chunk_size=512"]
    commands = {
        "stallfree": ([*stallfree, "port=8131"], 8131),
        # the control: iterations take the cost model's time (sleeps), so CPU contention barely moves the server
        "simulated": ([*stallfree, "model.runner=simulated", f"model.cost_model={args.cost_model}", "port=8133"],
                      8133),
        "vllm": (["bash", args.peer_script, "serve", str(model_dir), "8132", "--dtype", "float32",
                  # the runs resend the same prompts (--together copies: each one twice): no prefix-cache hits
                  "--served-model-name", args.model, "--no-enable-prefix-caching"], 8132),
    }
    runs = []
    for name in args.servers.split(","):
        command, port = commands[name]
        url = f"http://127.0.0.1:{port}"
        proc = start_server(command, url, work / f"server-{name}.log")
        try:
            runs += measure_server(args, name, proc, url, model_dir, work)
        finally:
            stop_server(proc)
    result = {"model": args.model, "dtype": "float32", "num_requests": args.num_requests, "qps": args.qps,
              "arrival": "poisson", "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "seed": args.seed, "repeats": args.repeats, "together": args.together, "cpus": os.cpu_count(),
              "comparison": compare(runs), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["comparison"], indent=2))


if __name__ == "__main__":
    main()
