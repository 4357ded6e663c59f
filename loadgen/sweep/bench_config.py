"""Views of a composed stallfree-bench config that several parts of a run share: the server-side knobs
(engine.hydra_groups maps the model / scheduler groups), plain sections, stable digests, the model's
vocabulary.
"""
from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from stallfree.engine import SCHEDULERS
from stallfree.engine.hydra_groups import ConfigError, engine_kwargs_from_groups


def chunk_size(cfg: DictConfig) -> int | None:
    """The chunk size the run's policy uses; None for policies that ignore it."""
    return int(cfg.chunk_size) if SCHEDULERS[cfg.scheduler.name].chunked else None


def engine_kwargs(cfg: DictConfig) -> dict:
    """``LLMEngine.from_kwargs`` arguments: the server-side knobs of a run."""
    return engine_kwargs_from_groups(cfg.model, cfg.scheduler, chunk_size(cfg))


def section(cfg: DictConfig, key: str):
    """``cfg[key]`` as plain Python (a resolved dict for a config group)."""
    return OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_dict(cfg[key]) else cfg[key]


def digest(value) -> str:
    """A short stable hash of a JSON-able value (dict key order does not matter)."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _model_path(cfg: DictConfig):
    from stallfree.engine import resolve_model_path

    try:
        return resolve_model_path(engine_kwargs(cfg)["model"])
    except ValueError as e:
        raise ConfigError(f"model.name: {e}") from None


def workload_tokenizer(cfg: DictConfig):
    """The tokenizer that counts a text workload's tokens: ``workload.tokenizer`` (a directory), by
    default the run's model's; None for workloads of token ids."""
    from stallfree.loadgen.workload.request_specs import is_text_workload
    from stallfree.loadgen.workload.text_prompts import load_tokenizer

    if not is_text_workload(section(cfg.workload, "lengths")):
        return None
    return load_tokenizer(str(cfg.workload.get("tokenizer") or _model_path(cfg)))


def model_vocab_size(cfg: DictConfig) -> int:
    """The vocabulary of the run's model (prompt token ids are drawn below it), from its config.json or,
    for a simulated deployment, its model shape."""
    if cfg.model.get("deployment") is not None:
        from stallfree.engine.simulator.deployment import Deployment

        return int(Deployment.from_config(section(cfg.model, "deployment")).resolve().shape.vocab_size)
    return int(json.loads((_model_path(cfg) / "config.json").read_text())["vocab_size"])
