"""Run planning: where a run's results go and what identifies it.

The run id names the swept knobs (scheduler, chunk_size, qps) plus a hash of everything else that
shapes the measurement, so a changed setting never reuses a stale run. A server the bench did not start
(``target.url``) is named by its label instead (``engine=vllm-0.32.0-url,qps=...``): the bench's engine knobs
did not configure it, so they are neither in its id nor in its config.yaml.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from stallfree.engine import EngineConfig
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import chunk_size, digest, engine_identity, without_new_defaults
from stallfree.loadgen.results.run_dir import make_run_id

MEASURED_SECTIONS = ("workload", "arrival", "target", "num_requests", "warmup", "seed")  # and the engine's


@dataclass
class RunPlan:
    exp_dir: Path
    run_id: str
    digest: str  # hash of the measured settings other than the swept knobs in the run id
    params: dict  # run parameters, the first keys of summary.json (point_id: the same for every seed)
    config: dict  # what config.yaml records: the BenchConfig, a running server's without the engine's sections

    @property
    def run_dir(self) -> Path:
        return self.exp_dir / self.run_id


# The engine's sections configure an engine the bench runs, not a server elsewhere.
ENGINE_SECTIONS = tuple(f.name for f in dataclasses.fields(EngineConfig))


@dataclass(frozen=True)
class ServerIdentity:
    """A server the bench did not start (``target.url``): what names its runs."""

    label: str  # target.label, else what the server says it is (loadgen.targets.server_check.ServerInfo.label)
    served_model: str  # target.served_model, else the server's only model

    @property
    def slug(self) -> str:
        """The label as a run id part: ``vllm 0.32.0 (url)`` -> ``vllm-0.32.0-url``."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.label).strip("-")


def server_identity(cfg: BenchConfig) -> ServerIdentity | None:
    """A running server (``target.url``) is identified by its label and the model it serves, not by the
    bench's scheduler, chunk size and model, which did not configure it; the server is asked only for what
    ``target.label`` / ``target.served_model`` leave open. None for a server the bench runs."""
    url, t = cfg.target.url, cfg.target
    if url is None:
        return None
    if t.label and t.served_model:
        return ServerIdentity(t.label, t.served_model)
    from stallfree.loadgen.targets.server_check import describe_server

    server = describe_server(url.rstrip("/"), t.served_model)
    return ServerIdentity(t.label or server.label, server.served_model)


def _server_config(cfg: BenchConfig, server: ServerIdentity) -> dict:
    """A running server's run config: the target as the run saw it, its workload and load, no engine knobs.
    ``prompt_tokenizer`` names what writes the text prompts of a workload of lengths (the model's, when
    no tokenizer is set, only for that)."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ENGINE_SECTIONS}
    target = {**config["target"], "label": server.label, "served_model": server.served_model}
    return config | {"target": target,
                     "prompt_tokenizer": cfg.target.tokenizer or cfg.workload.tokenizer or cfg.model.model}


def engine_dtype(cfg: BenchConfig) -> str:
    """The dtype the run's engine computes in: model.dtype as the engine resolves it on this machine (``auto``:
    bf16 where it is native). The bench starts that engine, in this process or as a server on this machine."""
    from stallfree.engine import choose_dtype  # torch: only once a run is planned (--help stays fast)

    return choose_dtype(cfg.model.dtype, cfg.model.device).name


def plan_run(cfg: BenchConfig, capacity_slo: str | None = None, rerun: bool = False) -> RunPlan:
    """Where a run goes and what it is. The id hashes every setting that shapes the measurement
    (not the SLO, which only changes the summary, except for the points of a capacity search): the engine's
    every field (loadgen.config.views.engine_identity) and the measured groups of the BenchConfig; a running server's
    (``target.url``) hashes its config without the engine's sections (``_server_config``) and is named by its
    label.
    ``rerun``: the second measurement of a disturbed point, a run of its own (``rerun=1`` in the id)."""
    server = server_identity(cfg)
    if server is None:
        config = dataclasses.asdict(cfg)
        measured = {key: config[key] for key in MEASURED_SECTIONS} | {"engine": engine_identity(cfg)}
        point = {"scheduler": cfg.scheduler.policy, "chunk_size": chunk_size(cfg)}
        labels = {"scheduler": cfg.scheduler.policy, "policy": cfg.scheduler.policy, "engine_label": None,
                  "chunk_size": chunk_size(cfg), "model": cfg.model.model, "prefix_caching": cfg.cache.enable_prefix_caching}
    else:
        config = _server_config(cfg, server)
        measured = {key: config[key] for key in (*MEASURED_SECTIONS, "prompt_tokenizer")}
        point = {"engine": server.slug}
        labels = {"scheduler": server.label, "policy": None, "engine_label": server.label, "chunk_size": None,
                  "model": server.served_model, "prefix_caching": None}  # a running server's own: unknown here
    measured = without_new_defaults(measured)
    measured["arrival"] = {k: v for k, v in measured["arrival"].items() if k != "qps"}  # in the id itself
    settings_digest = digest(measured)
    point["qps"] = cfg.qps
    point_id = make_run_id({**point, "cfg": digest({k: v for k, v in measured.items() if k != "seed"})})
    params = {**labels, "qps": cfg.qps, "point_id": point_id,
              "dtype": None if server is not None else engine_dtype(cfg),  # a server's own: unknown here
              "target": cfg.target.kind, "workload": cfg.workload.name, "arrival": cfg.arrival.kind,
              "seed": cfg.seed, "num_requests": cfg.num_requests}
    if capacity_slo is not None:
        point["slo"] = params["capacity_search"] = capacity_slo
    if rerun:
        point["rerun"] = params["rerun"] = 1
    return RunPlan(Path(cfg.results_dir) / cfg.experiment_name, make_run_id({**point, "cfg": settings_digest}),
                   settings_digest, params, config)
