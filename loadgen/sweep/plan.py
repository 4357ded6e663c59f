"""Run planning: where a run's results go and what identifies it.

The run id names the swept knobs (scheduler, chunk_size, qps) plus a hash of everything else that
shapes the measurement, so a changed setting never reuses a stale run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stallfree.loadgen.results.run_dir import make_run_id
from stallfree.loadgen.sweep.bench_config import chunk_size, digest
from stallfree.loadgen.sweep.bench_schema import BenchConfig

MEASURED_SECTIONS = ("model", "scheduler", "workload", "arrival", "target", "num_requests", "warmup", "seed")


@dataclass
class RunPlan:
    exp_dir: Path
    run_id: str
    digest: str  # hash of the measured settings other than the swept knobs in the run id
    params: dict  # run parameters, the first keys of summary.json (point_id: the same for every seed)

    @property
    def run_dir(self) -> Path:
        return self.exp_dir / self.run_id


def server_label(cfg: BenchConfig) -> str | None:
    """A server the bench did not start (``target.url``) is labelled with what the bench knows of it:
    ``target.label``, else the model it serves (``target.served_model``, else its /v1/models id), not with
    the bench's scheduler and chunk size, which did not configure it. None for a server the bench runs."""
    url = cfg.target.url
    if url is None:
        return None
    if cfg.target.label:
        return cfg.target.label
    from stallfree.loadgen.targets.server_check import check_server

    return check_server(url.rstrip("/"), cfg.target.served_model)


def engine_dtype(cfg: BenchConfig) -> str:
    """The dtype the run's engine computes in: model.dtype as the engine resolves it on this machine (``auto``:
    bf16 where it is native). The bench starts that engine, in this process or as a server on this machine."""
    from stallfree.engine import choose_dtype  # torch: only once a run is planned (--help stays fast)

    return choose_dtype(cfg.model.dtype, cfg.model.device).name


def plan_run(cfg: BenchConfig, capacity_slo: str | None = None, rerun: bool = False) -> RunPlan:
    """Where a run goes and what it is. The id hashes every setting that shapes the measurement
    (not the SLO, which only changes the summary, except for the points of a capacity search), as composed
    (BenchConfig.composed), so a run keeps its id across versions of the schema.
    ``rerun``: the second measurement of a disturbed point, a run of its own (``rerun=1`` in the id)."""
    measured = {key: cfg.composed[key] for key in MEASURED_SECTIONS}
    measured["arrival"] = {k: v for k, v in measured["arrival"].items() if k != "qps"}  # in the id itself
    measured["chunk_size"] = chunk_size(cfg)
    label = server_label(cfg)
    if label is not None:  # the bench's scheduler and chunk size do not apply to it
        measured["scheduler"] = measured["chunk_size"] = None
    settings_digest = digest(measured)
    point = ({"scheduler": cfg.scheduler.name, "chunk_size": chunk_size(cfg)} if label is None
             else {"scheduler": label, "chunk_size": None}) | {"qps": cfg.qps}
    point_id = make_run_id({**point, "cfg": digest({k: v for k, v in measured.items() if k != "seed"})})
    params = {**point, "point_id": point_id, "model": cfg.model.name,
              "dtype": None if label is not None else engine_dtype(cfg),  # a server's own: unknown here
              "target": cfg.target.kind, "workload": cfg.workload.name,
              "arrival": cfg.arrival.kind, "seed": cfg.seed, "num_requests": cfg.num_requests}
    if capacity_slo is not None:
        point["slo"] = params["capacity_search"] = capacity_slo
    if rerun:
        point["rerun"] = params["rerun"] = 1
    return RunPlan(Path(cfg.results_dir) / cfg.experiment_name, make_run_id({**point, "cfg": settings_digest}),
                   settings_digest, params)
