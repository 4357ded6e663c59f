"""The engine beside other work on the CPU: a burner at 0, 50 and 100% of one core, and the project's own
load generator against a served engine, with the adaptive thread count (engine/runner/cpu_threads.py) on
and off.

In process: preset ``small``, 4 prompts of 512 tokens, 32 output tokens each, sarathi-512; per condition
the wall time, the prefill-chunk and decode-iteration times (median, from the BatchRecords), the thread
counts used and the CPU share the engine got (ran / (ran + waited runnable), loadgen/sweep/cpu_share.py).
Conditions alternate within each repeat so that drift on the machine hits all of them alike; each adaptive
run starts from a fresh governor that has watched the condition for one sampling interval. Served:
``stallfree-bench target=http`` (and ``target=locust``) at ``--qps`` with ``model.adaptive_cpu_threads``
true and false, and for ``http`` the client at ``target.client_nice`` 0 and 5: P99 TBT, the engine's CPU
share and the load generator's CPU from each run's summary.

    python -m benchmarks.contention [--repeats 3] [--served-qps 4] [--out benchmarks/results/contention.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.lib.burner import Burner
from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.runner.cpu_threads import INTERVAL_S, CpuThreads
from stallfree.loadgen.sweep.cpu_share import CpuMonitor

PROMPTS, PROMPT_LEN, OUTPUT_LEN = 4, 512, 32
def run_offline(engine: LLMEngine, prompts: list[list[int]]) -> dict:
    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0, ignore_eos=True)
    engine.pop_batch_records()
    with CpuMonitor(os.getpid(), 0.0) as cpu:
        start = time.perf_counter()
        for prompt in prompts:
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        wall = time.perf_counter() - start
    records = engine.pop_batch_records()
    prefill = [r.end_time - r.start_time for r in records if r.num_prefill_tokens]
    decode = [r.end_time - r.start_time for r in records if not r.num_prefill_tokens]
    return {"wall_s": wall, "prefill_chunk_s": statistics.median(prefill), "decode_iter_s": statistics.median(decode),
            "threads": sorted({r.cpu_threads for r in records}), "engine_cpu_share": cpu.report.engine_cpu_share}


def fresh_governor(engine: LLMEngine) -> None:
    """Each adaptive run starts from a new governor that has watched the machine for one sampling interval
    while the engine idled, as a served engine's does between arrivals: no state carried over from the
    previous condition, and no first decision made blind."""
    engine.runner.cpu_threads = CpuThreads()
    time.sleep(INTERVAL_S)


def inprocess(repeats: int, duties: list[float]) -> list[dict]:
    default_threads = torch.get_num_threads()
    engines = {adaptive: LLMEngine.from_kwargs(model="small", scheduler="sarathi", chunk_size=512,
                                               adaptive_cpu_threads=adaptive) for adaptive in (False, True)}
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 8000, (PROMPTS, PROMPT_LEN), generator=g).tolist()
    for engine in engines.values():
        run_offline(engine, prompts)  # warm-up: kernels built, caches touched
    rows = []
    for repeat in range(repeats):
        for duty in duties:
            with Burner(duty):
                for adaptive, engine in engines.items():
                    torch.set_num_threads(default_threads)  # the adaptive engine may have lowered it
                    if adaptive:
                        fresh_governor(engine)
                    row = {"repeat": repeat, "burner": duty, "adaptive": adaptive, **run_offline(engine, prompts)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def served(qps: float, targets: list[str], num_requests: int) -> list[dict]:
    bench = Path(sys.executable).with_name("stallfree-bench")
    rows = []
    for target in targets:
        # target=http's client gives way to the server by target.client_nice (default 5): measured at 0 too
        for adaptive, nice in ((False, 0), (True, 0), (True, 5)) if target == "http" else ((False, None), (True, None)):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [str(bench), f"target={target}", "model=small", "scheduler=sarathi", "scheduler.chunk_size=512",
                       f"qps={qps}", f"num_requests={num_requests}", "workload=fixed", "workload.lengths.prompt=512",
                       "workload.lengths.output=32", f"model.adaptive_cpu_threads={str(adaptive).lower()}",
                       f"results_dir={tmp}", "experiment_name=contention", "min_engine_cpu_share=0",
                       *([f"target.client_nice={nice}"] if nice is not None else [])]
                subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
                summary = json.loads(next(Path(tmp).glob("contention/*/summary.json")).read_text())
            row = {"target": target, "qps": qps, "adaptive": adaptive, "client_nice": nice,
                   **{k: summary.get(k) for k in ("p99_tbt_ms", "median_ttft_ms", "engine_cpu_share",
                                                  "loadgen_cpu_share", "loadgen_cpu_ms_per_request",
                                                  "others_cpu_share")}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per (burner, adaptive): median wall and its ratio to the quiet fixed-thread engine's."""
    quiet = statistics.median(r["wall_s"] for r in rows if r["burner"] == 0 and not r["adaptive"])
    out = []
    for key in sorted({(r["burner"], r["adaptive"]) for r in rows}):
        group = [r for r in rows if (r["burner"], r["adaptive"]) == key]
        wall = statistics.median(r["wall_s"] for r in group)
        out.append({"burner": key[0], "adaptive": key[1], "wall_s": round(wall, 3), "vs_quiet": round(wall / quiet, 2),
                    "prefill_chunk_s": round(statistics.median(r["prefill_chunk_s"] for r in group), 4),
                    "decode_iter_s": round(statistics.median(r["decode_iter_s"] for r in group), 4),
                    "engine_cpu_share": round(statistics.median(r["engine_cpu_share"] for r in group), 2),
                    "threads": sorted({t for r in group for t in r["threads"]})})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burners", default="0,0.5,1", help="fractions of one core")
    ap.add_argument("--served-qps", type=float, default=4.0, help="0: skip the served runs")
    ap.add_argument("--served-targets", default="http,locust")
    ap.add_argument("--served-requests", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/contention.json"))
    args = ap.parse_args()
    rows = inprocess(args.repeats, [float(d) for d in args.burners.split(",")])
    result = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "load_avg_at_start": os.getloadavg()},
              "inprocess": {"rows": rows, "summary": summarize(rows)}}
    if args.served_qps > 0:
        result["served"] = served(args.served_qps, args.served_targets.split(","), args.served_requests)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| burner | adaptive | wall (s) | vs quiet | prefill chunk (s) | decode iter (s) | engine CPU share | threads |")
    print("|---|---|---|---|---|---|---|---|")
    for s in result["inprocess"]["summary"]:
        print(f"| {s['burner']:.0%} | {s['adaptive']} | {s['wall_s']} | {s['vs_quiet']}x | {s['prefill_chunk_s']} | "
              f"{s['decode_iter_s']} | {s['engine_cpu_share']} | {s['threads']} |")
    for s in result.get("served", []):
        print(f"served {s['target']} qps={s['qps']} adaptive={s['adaptive']} client_nice={s['client_nice']}: "
              f"p99 TBT {s['p99_tbt_ms']} ms, engine CPU share {s['engine_cpu_share']}, "
              f"load generator {s['loadgen_cpu_ms_per_request']} ms CPU a request")


if __name__ == "__main__":
    main()
