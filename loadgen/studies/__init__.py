"""``stallfree-bench +experiment=phases`` (and ``chunking``, ``tiles``): the characterisation studies on the
engine the Hydra config builds (``mode: study``), in this process. Each writes its rows into
``<results_dir>/<experiment_name>/phases.csv`` (the three presets share experiment ``phases``), replacing its
own earlier rows. The engine is kept across the studies of one process while its config stays the same."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from stallfree.engine import LLMEngine
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import digest
from stallfree.loadgen.studies.catalog import STUDIES, check_study
from stallfree.loadgen.studies.driver import IterationDriver
from stallfree.loadgen.studies.table import write_rows

__all__ = ["run_study"]

_engine: tuple[str, LLMEngine] | None = None  # (config digest, engine) of the last study in this process


def _engine_for(cfg: BenchConfig) -> LLMEngine:
    global _engine
    config = cfg.engine_sections()
    if config.model.deployment is not None:  # a pipelined deployment runs the studies' iterations one at a time
        model = dataclasses.replace(config.model, deployment={**config.model.deployment, "max_in_flight": 1})
        config = dataclasses.replace(config, model=model)
    key = digest(dataclasses.asdict(config))
    if _engine is None or _engine[0] != key:
        _engine = None  # free the old one first
        _engine = (key, LLMEngine.from_config(config))
    return _engine[1]


def run_info(cfg: BenchConfig, engine: LLMEngine) -> dict:
    limits = engine.utilization.limits
    return {"model": cfg.model.model, "device": limits.device if limits else str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."), "peak_flops": limits.peak_flops if limits else None,
            "bandwidth": limits.bandwidth if limits else None}


def run_study(cfg: BenchConfig) -> Path:
    """Run the study of ``cfg.study`` and write its rows; return phases.csv's path."""
    study = cfg.study or {}
    check_study(study)
    started, cpu = time.monotonic(), time.process_time()
    engine = _engine_for(cfg)
    driver = IterationDriver(engine, study["warmup"], study["repeats"], seed=cfg.seed)
    rows = STUDIES[study["name"]](driver, study, lambda line: print(line, flush=True))
    path = write_rows(Path(cfg.results_dir) / cfg.experiment_name, study["name"], rows, run_info(cfg, engine))
    print(f"[study {study['name']}] {len(rows)} iterations measured in {time.monotonic() - started:.0f} s "
          f"({time.process_time() - cpu:.0f} s of CPU) -> {path}", flush=True)
    return path
