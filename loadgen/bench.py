"""``stallfree-bench``: the Hydra app that runs one measured point per job (sweeps with ``-m``).

A job builds the workload from its config, replays it on the target (``inprocess``: an LLMEngine in
this process; ``http``: a ``stallfree-serve`` it starts; ``url``: a running server) and writes
``<results_dir>/<experiment_name>/<run_id>/`` through loadgen.results, then rebuilds the
experiment's summary.parquet. A run whose directory already holds summary.json is skipped (resume).
The run id names the swept knobs plus a hash of everything else that shapes the measurement, so a
changed setting never reuses a stale run. ``mode=capacity`` runs a capacity search instead
(loadgen.capacity), each of its points such a cached run.

Under the basic launcher the engine / server is kept across the jobs of a sweep and replaced only when
a server-side knob (model, scheduler, chunk_size) changes; other launchers start one per job.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import hydra
import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from engine import SCHEDULERS
from engine.hydra_groups import engine_kwargs_from_groups, serve_overrides
from loadgen import inprocess
from loadgen.config_check import CONF_DIR, CONFIG_NAME, ConfigError, check, exit_on_config_error, validate_cli
from loadgen.metrics import summarize
from loadgen.openloop import run_open_loop_sync
from loadgen.results import is_complete, make_run_id, rebuild_experiment_summary, write_run
from loadgen.workload import RequestSpec, build_workload

PROG = "stallfree-bench"
WARMUP_REQUESTS = 2  # short requests sent to a freshly started engine / server, not recorded


# ------------------------------------------------------------------------------------- config views


def chunk_size(cfg: DictConfig) -> int | None:
    """The chunk size the run's policy uses; None for policies that ignore it."""
    return int(cfg.chunk_size) if SCHEDULERS[cfg.scheduler.name].chunked else None


def engine_kwargs(cfg: DictConfig) -> dict:
    """``LLMEngine.from_kwargs`` arguments: the server-side knobs of a run."""
    return engine_kwargs_from_groups(cfg.model, cfg.scheduler, chunk_size(cfg))


def _digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _section(cfg: DictConfig, key: str):
    return OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_dict(cfg[key]) else cfg[key]


@dataclass
class RunPlan:
    exp_dir: Path
    run_id: str
    digest: str  # hash of the measured settings other than the swept knobs in the run id
    params: dict  # run parameters, the first keys of summary.json

    @property
    def run_dir(self) -> Path:
        return self.exp_dir / self.run_id


def plan_run(cfg: DictConfig, capacity_slo: str | None = None) -> RunPlan:
    """Where a run goes and what it is. The id hashes every setting that shapes the measurement
    (not the SLO, which only changes the summary, except for the points of a capacity search)."""
    measured = {key: _section(cfg, key) for key in ("model", "scheduler", "workload", "arrival", "target",
                                                   "num_requests", "warmup", "seed")}
    measured["arrival"].pop("qps", None)  # in the id itself
    measured["chunk_size"] = chunk_size(cfg)
    digest = _digest(measured)
    point = {"scheduler": cfg.scheduler.name, "chunk_size": chunk_size(cfg), "qps": float(cfg.qps)}
    params = {**point, "model": cfg.model.name, "target": cfg.target.kind, "workload": cfg.workload.name,
              "arrival": cfg.arrival.kind, "seed": int(cfg.seed), "num_requests": int(cfg.num_requests)}
    if capacity_slo is not None:
        point["slo"] = params["capacity_search"] = capacity_slo
    return RunPlan(Path(cfg.results_dir) / cfg.experiment_name, make_run_id({**point, "cfg": digest}), digest,
                   params)


# ------------------------------------------------------------------------------------- targets


class Target(Protocol):
    vocab_size: int

    def replay(self, specs: list[RequestSpec], *, warmup: int,
               progress) -> tuple[list[dict], list[dict] | None]: ...

    def close(self) -> None: ...


def model_vocab_size(cfg: DictConfig) -> int:
    """The vocabulary of the run's model (prompt token ids are drawn below it), from its config.json."""
    from engine import resolve_model_path

    try:
        path = resolve_model_path(engine_kwargs(cfg)["model"])
    except ValueError as e:
        raise ConfigError(f"model.name: {e}") from None
    return int(json.loads((path / "config.json").read_text())["vocab_size"])


class InProcessTarget:
    def __init__(self, cfg: DictConfig):
        from engine import LLMEngine

        try:
            self.engine = LLMEngine.from_kwargs(**engine_kwargs(cfg))
        except ValueError as e:
            raise ConfigError(f"engine: {e}") from None
        self.vocab_size = model_vocab_size(cfg)
        self.timeout_s = cfg.target.timeout_s

    def replay(self, specs, *, warmup, progress):
        return inprocess.replay(self.engine, specs, warmup=warmup, timeout_s=self.timeout_s,
                                progress=progress)

    def close(self) -> None:
        del self.engine


class HttpTarget:
    """An OpenAI-compatible server at ``url``; ``server`` is the stallfree-serve process we started."""

    def __init__(self, cfg: DictConfig, url: str, served_model: str, server: subprocess.Popen | None = None):
        self.url, self.served_model, self.server = url, served_model, server
        self.vocab_size = model_vocab_size(cfg)
        self.max_in_flight, self.timeout_s = cfg.target.max_in_flight, cfg.target.timeout_s

    def replay(self, specs, *, warmup, progress):
        start = time.time()
        rows = run_open_loop_sync(self.url, specs, model=self.served_model, max_in_flight=self.max_in_flight,
                                  timeout_s=self.timeout_s, warmup=warmup, progress=progress)
        return rows, self._batches_since(start) if self.server is not None else None

    def _batches_since(self, start: float) -> list[dict]:
        """The iterations of our own stallfree-serve during the run (GET /stallfree/batches)."""
        response = httpx.get(f"{self.url}/stallfree/batches", params={"since": start}, timeout=60)
        response.raise_for_status()
        return response.json()["batches"]

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _serve_command_line(cfg: DictConfig, port: int) -> list[str]:
    """``stallfree-serve`` overrides (conf/serve.yaml shares the model / scheduler groups)."""
    server = {"chunk_size": cfg.chunk_size, "host": cfg.target.host, "port": port, "served_model_name": cfg.model.name}
    return serve_overrides(_section(cfg, "model"), _section(cfg, "scheduler"), server)


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM when the bench process dies, even by SIGKILL."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(cfg: DictConfig, log_dir: Path) -> HttpTarget:
    """Start ``stallfree-serve`` and wait until it answers; its output goes to log_dir/server-<port>.log."""
    port = cfg.target.port or _free_port(cfg.target.host)
    url = f"http://{cfg.target.host}:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{port}.log"
    exe = Path(sys.executable).with_name("stallfree-serve")
    command = [str(exe) if exe.exists() else "stallfree-serve", *_serve_command_line(cfg, port)]
    target = HttpTarget(cfg, url, cfg.model.name)
    die_with_parent = _die_with_parent if sys.platform == "linux" else None
    with open(log_path, "w") as log:
        server = target.server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  preexec_fn=die_with_parent)
    deadline = time.monotonic() + cfg.target.startup_timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log_path.read_text().strip().splitlines()[-1:] or ["(no output)"]
            raise ConfigError(f"target: stallfree-serve exited with status {server.returncode}: {tail[0]} "
                              f"(log: {log_path})")
        try:
            if httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200:
                return target
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    target.close()
    raise RuntimeError(f"stallfree-serve did not answer on {url} within {cfg.target.startup_timeout_s} s "
                       f"(log: {log_path})")


def _warm_up(target: Target, seed: int) -> None:
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 16, "output": 4}, WARMUP_REQUESTS,
                           seed, target.vocab_size)
    target.replay(specs, warmup=0, progress=None)


_alive: dict[str, Target] = {}  # at most one: the target of the current server config


def close_target() -> None:
    while _alive:
        _alive.popitem()[1].close()


def open_target(cfg: DictConfig, log_dir: Path) -> Target:
    """The run's target, reusing the live one when its server-side config is the same."""
    kind = cfg.target.kind
    key = _digest([kind, cfg.target.get("url") or engine_kwargs(cfg)])
    if key not in _alive:
        close_target()
        if kind == "inprocess":
            target = InProcessTarget(cfg)
        elif kind == "http":
            target = start_server(cfg, log_dir)
        elif kind == "locust":
            from loadgen.locust_target import LocustTarget

            target = LocustTarget(cfg, log_dir)
        else:
            target = HttpTarget(cfg, cfg.target.url.rstrip("/"), cfg.target.served_model)
        _warm_up(target, cfg.seed)
        _alive[key] = target
    return _alive[key]


atexit.register(close_target)


# ------------------------------------------------------------------------------------- SLO


def decode_iteration_ms(cfg: DictConfig, exp_dir: Path) -> float:
    """Median decode-only iteration time: the token gaps of a burst of short-prompt requests that
    decode together. Measured once per model / target / probe shape and cached in exp_dir/.probes/."""
    p = cfg.decode_probe
    key = {"model": _section(cfg, "model"), "target": cfg.target.kind, "url": cfg.target.get("url"),
           "probe": _section(cfg, "decode_probe")}
    path = exp_dir / ".probes" / f"decode-{_digest(key)}.json"
    if path.is_file():
        return json.loads(path.read_text())["decode_iter_ms"]
    target = open_target(cfg, exp_dir / ".logs")
    lengths = {"kind": "fixed", "prompt": p.prompt_tokens, "output": p.output_tokens}
    specs = build_workload({"kind": "burst"}, lengths, p.num_seqs, cfg.seed, target.vocab_size)
    rows, _ = target.replay(specs, warmup=0, progress=None)
    gaps = [np.diff(row["server_token_times"] or row["token_times"]) for row in rows if row["status"] == "ok"]
    gaps = np.concatenate([np.empty(0), *gaps])
    if not len(gaps):
        raise RuntimeError(f"decode probe got no token gaps: {[row['error'] for row in rows]}")
    value = float(np.median(gaps) * 1e3)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"decode_iter_ms": value, **key}, indent=2) + "\n")
    tmp.replace(path)
    return value


def resolve_slo(cfg: DictConfig, exp_dir: Path) -> dict:
    """SLO fields of the summary: slo_name, slo_tbt_ms (absolute or tbt_multiple x decode_iter_ms)."""
    if cfg.slo.tbt_ms is not None:
        return {"slo_name": cfg.slo.name, "slo_tbt_ms": float(cfg.slo.tbt_ms), "decode_iter_ms": None}
    decode_ms = decode_iteration_ms(cfg, exp_dir)
    return {"slo_name": cfg.slo.name, "slo_tbt_ms": cfg.slo.tbt_multiple * decode_ms,
            "decode_iter_ms": decode_ms}


# ------------------------------------------------------------------------------------- runs


def _fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _report(status: str, plan: RunPlan, s: dict) -> None:
    print(f"[{status}] {plan.run_id}: {s['completed']} ok / {s['failed']} failed, "
          f"p99 TBT {_fmt(s['p99_tbt_ms'])} ms (SLO {_fmt(s['slo_tbt_ms'], '.0f')}), "
          f"median TTFT {_fmt(s['median_ttft_ms'])} ms, {_fmt(s['output_throughput'])} tok/s"
          + (" [client fell behind]" if s["client_fell_behind"] else ""), flush=True)


def run_point(cfg: DictConfig, capacity_slo: str | None = None) -> dict:
    """Measure one point (or read it back when complete); return its summary."""
    plan = plan_run(cfg, capacity_slo)
    if is_complete(plan.run_dir):
        summary = json.loads((plan.run_dir / "summary.json").read_text())
        _report("cached", plan, summary)
        return summary
    slo = resolve_slo(cfg, plan.exp_dir)
    target = open_target(cfg, plan.exp_dir / ".logs")
    specs = build_workload(_section(cfg, "arrival"), _section(cfg.workload, "lengths"), cfg.num_requests,
                           cfg.seed, target.vocab_size, cfg.workload.max_total_tokens)
    with tqdm(total=len(specs), desc=plan.run_id[:60], unit="req", leave=False, disable=None) as bar:
        rows, batches = target.replay(specs, warmup=cfg.warmup, progress=lambda row: bar.update())
    if any(row["status"] == "aborted" for row in rows):  # the HTTP replay returns its rows on Ctrl-C
        raise KeyboardInterrupt(f"{plan.run_id} was interrupted; nothing recorded")
    summary = {"experiment": cfg.experiment_name, "run_id": plan.run_id, **plan.params, **slo,
               **summarize(pd.DataFrame(rows), slo_tbt_ms=slo["slo_tbt_ms"], slo_ttft_ms=cfg.slo.ttft_ms)}
    run_dir = write_run(plan.exp_dir, plan.run_id, config=OmegaConf.to_container(cfg, resolve=True),
                        requests=rows, summary=summary, batches=batches)
    if cfg.target.kind == "locust":
        target.move_output(run_dir)  # Locust's CSV / HTML report -> run_dir/locust/
    rebuild_experiment_summary(plan.exp_dir)
    _report("done", plan, summary)
    return summary


def _keeps_targets() -> bool:
    """Only the basic launcher runs every job in this process, so only it can reuse a live target."""
    return "BasicLauncher" in str(HydraConfig.get().launcher.get("_target_", ""))


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def _app(cfg: DictConfig) -> None:
    def job() -> None:
        check(cfg)
        if cfg.mode == "capacity":
            from loadgen.capacity import run_search

            run_search(cfg)
        else:
            run_point(cfg)

    try:
        exit_on_config_error(PROG, job)
    finally:
        if not _keeps_targets():
            close_target()


def main() -> None:
    exit_on_config_error(PROG, lambda: validate_cli(sys.argv[1:]))
    _app()
