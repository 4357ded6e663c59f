"""SYNTHETIC results set for the analysis tests -- no engine, no model, no HTTP.

`write_synthetic_results` writes `ROOT/<experiment>/<run_id>/{config.yaml, requests.parquet,
batches.parquet, summary.json}` plus `ROOT/<experiment>/summary.parquet`, in the exact layout and
column/key names of docs/results.md. The numbers come from a toy discrete-event simulation of two
batch rules on a virtual clock with a linear iteration-cost model:

* `vllm`: whole prompts, prefill-only iterations whenever a prefill is admitted (decodes stall);
* `sarathi`: stall-free batching, every decode first, then prefill chunks within `chunk_size` tokens.

So TBT spikes line up with prefill-only iterations, and sarathi has the lower P99 TBT. It only stands
in for a real `tiny` sweep until the end-to-end test runs one; nothing here is a measurement.

    python tests/helpers/fakes/synthetic_results.py OUT_DIR     # writes OUT_DIR/synthetic/...
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

EXPERIMENT = "synthetic"
CONFIGS = (("vllm", None), ("sarathi", 256), ("sarathi", 512))
QPS = (0.5, 1.0, 2.0, 4.0)
EPOCH = 1.7e9
MAX_NUM_SEQS = 48
MAX_NUM_BATCHED_TOKENS = 4096
SLO_TBT_MS = 100.0
SLO_TTFT_MS = 2000.0
METRICS = ("ttft", "tpot", "itl", "tbt", "e2el", "normalized_latency", "scheduling_delay")


def iteration_s(prefill_tokens: int, decode_tokens: int) -> float:
    """Toy cost model: fixed overhead + per prefill token + per decode token."""
    return 0.010 + 1.2e-4 * prefill_tokens + 2.5e-4 * decode_tokens


@dataclass
class _Request:
    request_id: str
    arrival: float
    prompt: int
    output: int
    computed: int = 0
    first_scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prompt


def _workload(qps: float, duration_s: float, seed: int) -> list[_Request]:
    rng = np.random.default_rng(seed)
    n = max(4, int(qps * duration_s))
    arrivals = np.cumsum(rng.exponential(1.0 / qps, n))
    prompts = rng.integers(300, 2000, n)
    outputs = rng.integers(80, 400, n)
    return [_Request(f"req-{i}", float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))]


def _schedule(scheduler: str, chunk: int | None, waiting: list[_Request],
              running: list[_Request]) -> list[tuple[_Request, int]]:
    """One iteration's (request, num_new_tokens) units; admits from `waiting` into `running`."""
    if scheduler == "vllm":
        units: list[tuple[_Request, int]] = []
        budget = MAX_NUM_BATCHED_TOKENS
        while waiting and waiting[0].prompt <= budget and len(running) < MAX_NUM_SEQS:
            req = waiting.pop(0)
            running.append(req)
            units.append((req, req.prompt))
            budget -= req.prompt
        return units or [(r, 1) for r in running]
    units = [(r, 1) for r in running if not r.in_prefill]
    budget = chunk - len(units)
    for req in [r for r in running if r.in_prefill]:
        n = min(req.prompt - req.computed, budget)
        if n > 0:
            units.append((req, n))
            budget -= n
    while waiting and budget > 0 and len(running) < MAX_NUM_SEQS:
        req = waiting.pop(0)
        running.append(req)
        n = min(req.prompt, budget)
        units.append((req, n))
        budget -= n
    return units


def _simulate(scheduler: str, chunk: int | None, requests: list[_Request]) -> pd.DataFrame:
    """Runs the batch rule on a virtual clock; fills the requests' times, returns the batch rows."""
    pending = sorted(requests, key=lambda r: r.arrival)
    waiting: list[_Request] = []
    running: list[_Request] = []
    rows = []
    t = pending[0].arrival
    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append(pending.pop(0))
        units = _schedule(scheduler, chunk, waiting, running)
        if not units:
            t = pending[0].arrival
            continue
        n_prefill_seqs = sum(req.in_prefill for req, _ in units)
        n_prefill = sum(n for req, n in units if req.in_prefill)
        n_decode = len(units) - n_prefill_seqs
        end = t + iteration_s(n_prefill, n_decode)
        for req, n in units:
            req.first_scheduled = req.first_scheduled if req.first_scheduled is not None else t
            req.computed += n
            if not req.in_prefill:
                req.token_times.append(end)
        running[:] = [r for r in running if len(r.token_times) < r.output]
        rows.append({
            "iteration": len(rows), "start_time": EPOCH + t, "end_time": EPOCH + end,
            "num_prefill_tokens": n_prefill, "num_decode_tokens": n_decode,
            "num_prefill_seqs": n_prefill_seqs, "num_decode_seqs": n_decode,
            "num_preemptions": 0,
            "num_kv_blocks_used": sum(-(-r.computed // 16) for r in running),
            "num_waiting": len(waiting), "num_running": len(running),
        })
        t = end
    return pd.DataFrame(rows)


def _request_rows(requests: list[_Request], seed: int) -> pd.DataFrame:
    """Client/server view of the simulated requests: 0.2-0.7 ms network delay each way, the first
    request is warmup, one extra request failed."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, req in enumerate(requests):
        net = float(rng.uniform(0.0002, 0.0007))
        server = [EPOCH + x for x in req.token_times]
        client = [x + net for x in server]
        rows.append({
            "request_id": req.request_id, "status": "ok", "error": None, "is_warmup": i == 0,
            "prompt_tokens": req.prompt, "max_tokens": req.output, "output_tokens": len(client),
            "intended_send_time": EPOCH + req.arrival - net, "send_time": EPOCH + req.arrival - net / 2,
            "first_token_time": client[0], "finish_time": client[-1], "token_times": client,
            "server_arrival_time": EPOCH + req.arrival,
            "server_first_scheduled_time": EPOCH + req.first_scheduled,
            "server_finish_time": server[-1], "server_token_times": server, "num_preemptions": 0,
        })
    last = requests[-1].arrival + 0.5
    rows.append({
        "request_id": "req-failed", "status": "error", "error": "synthetic: connection reset",
        "is_warmup": False, "prompt_tokens": 500, "max_tokens": 100, "output_tokens": 0,
        "intended_send_time": EPOCH + last, "send_time": EPOCH + last, "first_token_time": None,
        "finish_time": None, "token_times": [], "server_arrival_time": None,
        "server_first_scheduled_time": None, "server_finish_time": None, "server_token_times": [],
        "num_preemptions": None,
    })
    return pd.DataFrame(rows).astype({"num_preemptions": "Int64"})


def _stats(name: str, values_s: np.ndarray) -> dict[str, float]:
    ms = np.asarray(values_s, dtype=float) * 1000.0
    pct = {"median": 50, "p90": 90, "p95": 95, "p99": 99, "p99.9": 99.9}
    out = {f"mean_{name}_ms": float(ms.mean()), f"std_{name}_ms": float(ms.std())}
    out.update({f"{k}_{name}_ms": float(np.percentile(ms, q)) for k, q in pct.items()})
    return out


def _summary(params: dict, requests: pd.DataFrame) -> dict:
    ok = requests[(requests.status == "ok") & ~requests.is_warmup]
    first = ok.first_token_time - ok.intended_send_time
    last = ok.token_times.map(lambda ts: ts[-1]) - ok.intended_send_time
    gaps = np.concatenate([np.diff(ts) for ts in ok.token_times])
    duration = float(ok.token_times.map(lambda ts: ts[-1]).max() - ok.intended_send_time.min())
    n_out = int(ok.output_tokens.sum())
    lag = (requests.send_time - requests.intended_send_time).to_numpy()
    per_request_tbt_ok = ok.token_times.map(lambda ts: np.diff(ts).max() * 1000 <= SLO_TBT_MS)
    good = int((per_request_tbt_ok & (first * 1000 <= SLO_TTFT_MS)).sum())
    out = {**params, "completed": len(ok), "failed": int((requests.status != "ok").sum()),
           "duration": duration, "total_input_tokens": int(ok.prompt_tokens.sum()),
           "total_output_tokens": n_out, "request_throughput": len(ok) / duration,
           "output_throughput": n_out / duration,
           "total_token_throughput": (n_out + int(ok.prompt_tokens.sum())) / duration,
           "request_goodput": good / duration}
    series = {"ttft": first, "tpot": (last - first) / (ok.output_tokens - 1), "itl": gaps, "tbt": gaps,
              "e2el": last, "normalized_latency": last / ok.output_tokens,
              "scheduling_delay": ok.server_first_scheduled_time - ok.server_arrival_time}
    for name in METRICS:
        out.update(_stats(name, np.asarray(series[name], dtype=float)))
    sends = requests.send_time.to_numpy()
    out.update({
        "schedule_lag_p50_ms": float(np.percentile(lag, 50) * 1000),
        "schedule_lag_p99_ms": float(np.percentile(lag, 99) * 1000),
        "schedule_lag_max_ms": float(lag.max() * 1000), "offered_rate": params["qps"],
        "achieved_rate": (len(sends) - 1) / float(sends.max() - sends.min()),
        "client_fell_behind": False, "slo_tbt_ms": SLO_TBT_MS, "slo_ttft_ms": SLO_TTFT_MS,
    })
    return out


def write_run(exp_dir: Path, scheduler: str, chunk: int | None, qps: float, duration_s: float,
              seed: int, with_batches: bool = True) -> dict:
    """Simulates and writes one run directory; returns its summary dict."""
    run_id = f"{scheduler}-qps{qps:g}" if chunk is None else f"{scheduler}-cs{chunk}-qps{qps:g}"
    run_dir = exp_dir / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    requests = _workload(qps, duration_s, seed)
    batches = _simulate(scheduler, chunk, requests)
    params = {"experiment": exp_dir.name, "run_id": run_id, "scheduler": scheduler, "chunk_size": chunk,
              "qps": qps, "model": "synthetic", "target": "synthetic", "workload": "uniform",
              "arrival": "poisson", "seed": seed}
    frame = _request_rows(requests, seed)
    frame.to_parquet(run_dir / "requests.parquet", index=False)
    if with_batches:
        batches.to_parquet(run_dir / "batches.parquet", index=False)
    summary = _summary(params, frame)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**params, "synthetic": True}, sort_keys=False))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def write_synthetic_results(root: str | Path, experiment: str = EXPERIMENT,
                            configs: tuple[tuple[str, int | None], ...] = CONFIGS,
                            qps: tuple[float, ...] = QPS, duration_s: float = 30.0,
                            with_batches: bool = True) -> Path:
    """Writes a SYNTHETIC experiment under ROOT/<experiment>/ and returns the experiment dir."""
    exp_dir = Path(root) / experiment
    summaries = [write_run(exp_dir, sched, chunk, q, duration_s, seed=i, with_batches=with_batches)
                 for sched, chunk in configs for i, q in enumerate(qps)]
    pd.DataFrame(summaries).to_parquet(exp_dir / "summary.parquet", index=False)
    return exp_dir


if __name__ == "__main__":
    print(write_synthetic_results(sys.argv[1] if len(sys.argv) > 1 else "results"))
