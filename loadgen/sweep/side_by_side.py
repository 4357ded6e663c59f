"""mode=compare (``+experiment=compare``): engines side by side. Each job measures one contender
(conf/contender/) as every other: its ``compare.qps`` points (loadgen.sweep.point), then its capacity search
(loadgen.sweep.capacity_search), on one live target. A url contender whose server does not answer is
skipped with one line, and the sweep goes on with the others.

Each job records its contender, measured (its capacity record and the run ids of its QPS points) or
missing (why), in ``<results_dir>/<experiment_name>/.compare/<contender>.json``, and
rebuilds ``compare.json``, the list of them, which the report's comparison reads (analysis.compare).
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.experiment_lock import experiment_lock
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.point import repeat_configs, run_point
from stallfree.loadgen.sweep.progress import RunPart
from stallfree.loadgen.targets.server_check import served_models

DEFAULT_PORT = 8000


def missing_reason(cfg: BenchConfig) -> str | None:
    """Why the job's url contender cannot be measured (its server does not answer), or None."""
    url = cfg.target.url
    if url is None:
        return None
    try:
        served_models(url.rstrip("/"))
    except TargetError:
        key = "compare.vllm_url" if cfg.compare is not None and url == cfg.compare.vllm_url else "target.url"
        port = urlsplit(url).port or DEFAULT_PORT
        return (f"no server answers GET /v1/models at {key}={url}; start yours first, e.g. "
                f"`vllm serve MODEL --port {port}`, then run the same command again (complete runs are read back)")
    return None


def run_compare(cfg: BenchConfig, targets: LiveTarget) -> dict:
    """Measure the job's contender (or record it missing); return its compare record."""
    assert cfg.compare is not None  # BenchConfig requires it for mode=compare
    exp_dir = Path(cfg.results_dir) / cfg.experiment_name
    name = cfg.compare.contender
    reason = missing_reason(cfg)
    if reason is not None:
        print(f"[compare] {name} skipped: {reason}", flush=True)
        return _record(exp_dir, {"contender": name, "status": "missing", "reason": reason, "url": cfg.target.url})
    # The capacity search reports its share of the job from 0 on, so the points before it claim none.
    run_ids = [run_point(point_cfg, targets, part=RunPart(0.0, {"qps": qps}))["run_id"]
               for qps in cfg.compare.qps for point_cfg in repeat_configs(cfg.with_qps(qps))]
    return _record(exp_dir, {"contender": name, "status": "measured", "reason": None, "url": cfg.target.url,
                             **run_search(cfg, targets), "run_ids": run_ids})


def _record(exp_dir: Path, record: dict) -> dict:
    records_dir = exp_dir / ".compare"
    with experiment_lock(exp_dir):
        records_dir.mkdir(parents=True, exist_ok=True)
        (records_dir / f"{record['contender']}.json").write_text(json.dumps(record, indent=2) + "\n")
        records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))]
        (exp_dir / "compare.json").write_text(json.dumps(records, indent=2) + "\n")
    return record
