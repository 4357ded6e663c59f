"""vLLM ``bench serve --save-result`` files: stallfree runs written in that format, and such files (runs
of vLLM's own client) read back as rows of ``load_runs``, so both land on the same plots.

vLLM counts latencies from the actual send: its ``ttft`` / ``e2el`` are stallfree's ``ttft_from_send`` /
``e2el_from_send``; its ``tpot`` and ``itl`` are stallfree's ``tpot`` and ``tbt``. A vLLM run carries
only from-send latencies, so its rows fill both names (``latency_origin: "send"``). An exported run's
``backend`` is what served it: a running server's label (summary ``engine_label``, e.g. ``vllm 0.32.0 (url)``),
else ``stallfree``.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from stallfree.engine.records.request_metrics import per_request_metrics
from stallfree.engine.records.run_summary import read_summary

# vLLM metric -> the stallfree summary metrics that hold it
VLLM_METRICS = {"ttft": ("ttft_from_send",), "tpot": ("tpot",), "itl": ("itl",), "e2el": ("e2el_from_send",)}
STATS = ("mean", "median", "std", "p90", "p95", "p99", "p99.9")
TOTALS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
          "output_throughput", "total_token_throughput")
RUN_LABELS = ("experiment", "run_id", "scheduler", "chunk_size", "engine_label")  # kept as --metadata style keys
# when read back, vLLM's from-send metrics also fill stallfree's plotted names
ALSO_FILLS = {"ttft_from_send": ("ttft",), "itl": ("tbt",), "e2el_from_send": ("e2el",)}


def to_vllm_result(summary: dict, requests: pd.DataFrame) -> dict:
    """One run as vLLM's --save-result --save-detailed JSON (its run labels added as metadata keys)."""
    rows = per_request_metrics(requests)
    ok = rows["status"] == "ok"
    result = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": "openai",
              "backend": summary.get("engine_label") or "stallfree",
              "label": summary["run_id"], "model_id": summary.get("model"), "tokenizer_id": summary.get("model"),
              "num_prompts": len(rows), "request_rate": summary.get("qps"),
              "burstiness": 1.0 if summary.get("arrival") == "poisson" else None, "max_concurrency": None,
              **{key: summary.get(key) for key in RUN_LABELS},
              **{key: summary.get(key) for key in TOTALS},
              "request_goodput": summary.get("request_goodput_vllm")}
    for vllm_name, (ours, *_) in VLLM_METRICS.items():
        result.update({f"{stat}_{vllm_name}_ms": summary.get(f"{stat}_{ours}_ms") for stat in STATS})
    result.update({
        "input_lens": rows["prompt_tokens"].astype(int).tolist(),
        "output_lens": rows["output_tokens"].where(ok, 0).astype(int).tolist(),
        "ttfts": (rows["ttft_from_send_ms"].fillna(0.0) / 1e3).tolist(),
        "itls": [(np.asarray(gaps) / 1e3).tolist() for gaps in rows["tbt_ms"]],
        "generated_texts": [""] * len(rows),
        "errors": ["" if good else str(error) for good, error in zip(ok, rows["error"], strict=True)],
    })
    return result


def export_vllm(runs: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write ``out_dir/<run_id>.json`` for every run of ``load_runs`` that has its requests.parquet."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs.to_dict("records"):
        run_dir = Path(run["run_dir"]) if isinstance(run["run_dir"], str) else None
        if run_dir is None or not (run_dir / "requests.parquet").is_file():
            continue
        summary = read_summary(run_dir / "summary.json").flat()
        result = to_vllm_result(summary, pd.read_parquet(run_dir / "requests.parquet"))
        path = out_dir / f"{run['run_id']}.json"
        path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
        written.append(path)
    return written


def _json_default(value):
    return value.item() if hasattr(value, "item") else str(value)


def from_vllm_result(result: dict, path: Path) -> dict:
    """A load_runs row of one vLLM result file: run labels (its metadata keys when present, else
    ``vllm-<backend>`` as scheduler, the file's folder and name) and the summary metrics."""
    rate = result.get("request_rate")
    qps = math.nan if rate in (None, "inf") or float(rate) == math.inf else float(rate)
    row = {"experiment": result.get("experiment") or path.parent.name, "run_id": result.get("run_id") or path.stem,
           "scheduler": result.get("scheduler") or f"vllm-{result.get('backend', 'bench')}",
           "chunk_size": result.get("chunk_size"), "qps": qps, "model": result.get("model_id"),
           "source": "vllm", "latency_origin": "send", "run_dir": None,
           "request_goodput_vllm": result.get("request_goodput"),
           **{key: result.get(key) for key in TOTALS}}
    for vllm_name, names in VLLM_METRICS.items():
        for ours in names:
            for stat in STATS:
                value = result.get(f"{stat}_{vllm_name}_ms")
                for name in (ours, *ALSO_FILLS.get(ours, ())):
                    row[f"{stat}_{name}_ms"] = value
    return row


def read_vllm_results(paths: list[Path]) -> pd.DataFrame:
    """Rows of vLLM result files (see from_vllm_result)."""
    return pd.DataFrame([from_vllm_result(json.loads(p.read_text()), p) for p in paths])
