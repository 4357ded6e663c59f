"""Cross-check of the load generator against vLLM's own benchmark client (``vllm bench serve``).

Both clients send the same requests at the same times, against stallfree-serve and against vLLM's CPU
server on the same materialized preset directory: vLLM's client replays a ``timed_trace`` dataset
(per-request timestamps, token-id prompts expanded from hash ids, ignore_eos), with PYTHONHASHSEED fixed
so every run expands the same prompts; its requests are captured from its own run and stallfree's
open-loop dispatcher (loadgen.openai_client.openloop) replays exactly those, at the same offsets. ``--together``:
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
the server engine's CPU share (loadgen.sweep.cpu_share). vLLM's per-request timestamps are also summarized
by engine.records.request_metrics, which checks that the two define the metrics alike.

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
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.lib.process_tree import busiest_process
from benchmarks.lib.vllm_client import (
    ABORTED,
    finish_vllm_client,
    start_vllm_client,
    wait_for_start,
    write_subset,
    write_trace,
)
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.records import RequestRecord, RequestSpec, as_row
from stallfree.engine.records.request_metrics import summarize
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.sweep.cpu_share import CpuMonitor
from stallfree.loadgen.targets.server_process import ServerProcess

TOLERANCE = 0.05
SAME_STEP_MS = 10.0  # --together copies: the two copies of a request whose TTFTs differ less were served together
# vLLM's summary keys -> engine.records.request_metrics summary keys of the same definition
SAME_METRIC = {"median_ttft_ms": "median_ttft_from_send_ms", "median_tpot_ms": "median_tpot_ms",
               "median_itl_ms": "median_itl_ms"}
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


def vllm_figures(info: dict) -> dict:
    """client_figures of vLLM's run, with the medians vLLM itself reported."""
    return {**client_figures(info["records"], info["cpu_s"]),
            "vllm_reported": {key: info["result"][key] for key in SAME_METRIC}}


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
    return start_vllm_client(Path(args.peer_venv).expanduser() / "bin" / "python", url, args.model, model_dir, trace,
                             num_prompts or args.num_requests, work, tag, start_file)


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
    (work / f"{tag}.stallfree.json").write_text(json.dumps([as_row(r) for r in records]))
    return info, records, cpu_s


def measure_point(args: argparse.Namespace, name: str, engine_pid: int, url: str, model_dir: Path, qps: float, work: Path,
                  pool: ProcessPoolExecutor) -> list[dict]:
    """The runs of both clients at one rate, by ``--together`` (module docstring)."""
    trace = work / f"trace-{qps:g}.jsonl"
    write_trace(trace, args.num_requests, qps, args.prompt_len, args.max_tokens, args.seed)
    runs = []

    def record(client: str, i: int, figures: dict, monitor: CpuMonitor) -> None:
        server_cpu = dataclasses.asdict(monitor.report) if monitor.report else {}
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
                    figures = vllm_figures(info)
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


def measure_server(args: argparse.Namespace, name: str, proc: ServerProcess, url: str, model_dir: Path, work: Path) -> list[dict]:
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
        # engine.records.request_metrics on vLLM's own timestamps against the medians vLLM reports: the definitions agree
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
    ap.add_argument("--cost-model", default="engine/simulator/fitting/cost_models/small-cpu.json", help="for the simulated server")
    ap.add_argument("--out", default="benchmarks/results/vs_vllm_client.json")
    args = ap.parse_args()
    args.qps = [float(q) for q in args.qps.split(",")]
    model_dir = resolve_model_path(args.model)
    work = Path(tempfile.mkdtemp(prefix="vs_vllm_client-"))
    print(f"logs, traces and vLLM's result files: {work}", flush=True)
    stallfree = [str(Path(sys.executable).with_name("stallfree-serve")), f"model={args.model}", "model.dtype=float32",
                 "scheduler=sarathi", "scheduler.chunk_size=512"]
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
        with ServerProcess(command, url, work / f"server-{name}.log", startup_timeout_s=1200) as proc:
            runs += measure_server(args, name, proc, url, model_dir, work)
    result = {"model": args.model, "dtype": "float32", "num_requests": args.num_requests, "qps": args.qps,
              "arrival": "poisson", "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
              "seed": args.seed, "repeats": args.repeats, "together": args.together, "cpus": os.cpu_count(),
              "comparison": compare(runs), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["comparison"], indent=2))


if __name__ == "__main__":
    main()
