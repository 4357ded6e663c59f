"""Views of a composed stallfree-bench config that several parts of a run share: the server-side knobs
(engine.hydra_groups maps the model / scheduler groups), plain sections, stable digests, the model's
vocabulary.
"""
from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from engine import SCHEDULERS
from engine.hydra_groups import ConfigError, engine_kwargs_from_groups


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


def model_vocab_size(cfg: DictConfig) -> int:
    """The vocabulary of the run's model (prompt token ids are drawn below it), from its config.json."""
    from engine import resolve_model_path

    try:
        path = resolve_model_path(engine_kwargs(cfg)["model"])
    except ValueError as e:
        raise ConfigError(f"model.name: {e}") from None
    return int(json.loads((path / "config.json").read_text())["vocab_size"])
