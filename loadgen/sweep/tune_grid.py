"""The settings a tune searches (mode=tune, loadgen.sweep.tune): policy x chunk size x ``max_num_seqs`` from the
``tune`` group, the config's own setting always among them; each one applied to a bench config, live or simulated.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stallfree.engine import SCHEDULERS
from stallfree.loadgen.config.schema import BenchConfig, TargetGroup
from stallfree.loadgen.config.search_groups import TuneGroup


@dataclass(frozen=True)
class Setting:
    policy: str  # "": a server tuned through its launch flags (tune.serve_cmd), whose policy is its own
    chunk_size: int | None  # None: a policy without a token budget (it admits whole prompts), or not a flag
    max_num_seqs: int | None  # None: not a flag of the served command

    @property
    def label(self) -> str:
        parts = [self.policy] if self.policy else []
        parts += [] if self.chunk_size is None else [f"chunk {self.chunk_size}"]
        parts += [] if self.max_num_seqs is None else [f"max_num_seqs {self.max_num_seqs}"]
        return ", ".join(parts)

    @classmethod
    def of(cls, cfg: BenchConfig) -> Setting:
        sc = cfg.scheduler
        return cls(sc.policy, sc.chunk_size if SCHEDULERS[sc.policy].chunked else None, sc.max_num_seqs)

    def apply(self, cfg: BenchConfig) -> BenchConfig:
        chunk = cfg.scheduler.chunk_size if self.chunk_size is None else self.chunk_size
        scheduler = dataclasses.replace(cfg.scheduler, policy=self.policy, chunk_size=chunk,
                                        max_num_seqs=self.max_num_seqs)
        return dataclasses.replace(cfg, scheduler=scheduler)


def grid(cfg: BenchConfig, tune: TuneGroup) -> list[Setting]:
    """Every setting of the tune group, and the config's own, sorted."""
    settings = {Setting.of(cfg)}
    for policy in tune.policies:
        chunks = tune.chunk_sizes if SCHEDULERS[policy].chunked else [None]
        for chunk in chunks:
            for seqs in tune.max_num_seqs or [cfg.scheduler.max_num_seqs]:
                settings.add(Setting(policy, chunk, seqs))
    return sorted(settings, key=sort_key)


def sort_key(setting: Setting) -> tuple:
    return setting.policy, setting.chunk_size or 0, setting.max_num_seqs or 0


def simulated(cfg: BenchConfig, tune: TuneGroup) -> BenchConfig:
    """``cfg`` on the engine's simulated runner, in this process, on a virtual clock: the same schedulers and KV
    accounting, iteration times from ``tune.cost_model`` (or the model's: model.cost_model, else a profile of the
    real runner, cached), in experiment ``<name>-simulated``."""
    model = dataclasses.replace(cfg.model, runner="simulated", clock="virtual",
                                cost_model=tune.cost_model or cfg.model.cost_model)
    target = TargetGroup(kind="inprocess", timeout_s=cfg.target.timeout_s)
    return dataclasses.replace(cfg, model=model, target=target, experiment_name=f"{cfg.experiment_name}-simulated")


def pinned_slo(cfg: BenchConfig, decode_iter_ms: float | None) -> BenchConfig:
    """``cfg`` with its SLO's decode reference pinned, so that every setting, live or simulated, is judged
    against the same bound; an absolute SLO as it is."""
    if decode_iter_ms is None or cfg.slo.tbt_ms is not None:
        return cfg
    return dataclasses.replace(cfg, slo=dataclasses.replace(cfg.slo, reference_ms=decode_iter_ms,
                                                            reference_cost_model=None))
