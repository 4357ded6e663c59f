"""The one mapping from the Hydra config groups under ``conf/`` to engine settings.

``stallfree-serve`` and ``stallfree-bench`` both compose ``conf/`` (the ``model`` and ``scheduler`` groups
plus their own keys). This module holds the typed ``model`` and ``scheduler`` groups (ModelGroup,
SchedulerGroup), turns a composed config into such dataclasses once at an entry point (``typed``: every
error one line naming its key), builds the EngineConfig of two groups, and writes Hydra override values
(one quoting rule). It needs no torch, and imports Hydra only when it composes, so the load generator can
import it cheaply.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stallfree.engine.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig

# The Hydra configs ship as package data of stallfree.conf (the conf/ folder): found the same way from a
# checkout, an editable install or a wheel.
CONF_DIR = Path(str(importlib.resources.files("stallfree.conf")))
# Cost models committed with the package (engine/runner/cost_models/), named by file name in a setting.
COST_MODELS_DIR = Path(str(importlib.resources.files("stallfree.engine"))) / "runner" / "cost_models"
# Names the engine checks itself when it starts (their choices live with the code that uses them).
MODEL_NAMES = ("dtype", "device", "attention_backend", "runner", "clock")
T = TypeVar("T")


class ConfigError(ValueError):
    """A bad setting; the message starts with the key."""


def require(ok: bool, key: str, rule: str, value: object) -> None:
    """Raise ``ConfigError("<key> must be <rule>, got <value>")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def override(key: str, value: object) -> str:
    """``key=value`` as a Hydra command-line override that Hydra reads back as exactly ``value``:
    numbers, booleans and null as such, strings quoted literally (commas, '=', quotes, backslashes)."""
    if isinstance(value, str):
        # Hydra's rule inside single quotes: a quote, and any backslashes right before a quote or the end,
        # get a backslash each.
        quoted = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), value)
        return f"{key}='{quoted}'"
    return f"{key}={'null' if value is None else json.dumps(value)}"


def cost_model_file(value: object, key: str) -> str:
    """The cost model JSON a setting names: a file (relative to where you run), or the file name of one
    committed with the package (COST_MODELS_DIR)."""
    committed = sorted(p.name for p in COST_MODELS_DIR.glob("*.json"))
    if isinstance(value, str) and Path(value).expanduser().is_file():
        return str(Path(value).expanduser())
    require(isinstance(value, str) and value in committed, key, f"a cost model JSON file or one of {committed}",
            value)
    return str(COST_MODELS_DIR / value)


@dataclass
class ModelGroup:
    """The ``model`` group (conf/model/); checks that need no torch (unknown dtypes, devices, backends,
    runners and clocks are reported by the engine as it starts)."""

    name: str
    dtype: str
    device: str
    attention_backend: str
    runner: str
    clock: str
    path: str | None = None  # model=path: the checkpoint directory (the name follows it)
    cost_model: str | None = None
    max_model_len: int | None = None
    kv_memory_gib: float | None = None  # required unless a deployment sizes the KV cache itself
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    cuda_graphs: bool = True
    deployment: dict[str, Any] | None = None  # checked by engine/simulator/deployment.py
    op_split_every: int = 0
    adaptive_cpu_threads: bool = True  # CPU: threads = the cores other processes leave free
    tensor_parallel_size: int = 1  # processes that split each layer (engine/distributed/)
    pipeline_parallel_size: int = 1  # processes that each run a stage of layers

    def __post_init__(self) -> None:
        for key in ("name", *MODEL_NAMES):
            require(bool(getattr(self, key)), f"model.{key}", "a non-empty string", getattr(self, key))
        require(self.path is None or Path(self.path).expanduser().is_dir(), "model.path", "a checkpoint directory",
                self.path)
        require(self.max_model_len is None or self.max_model_len >= 2, "model.max_model_len",
                "an integer >= 2 or null", self.max_model_len)
        if self.deployment is None:  # a deployment sizes its KV cache itself (engine/simulator/memory_plan.py)
            require(is_number(self.kv_memory_gib) and self.kv_memory_gib > 0, "model.kv_memory_gib", "a number > 0",
                    self.kv_memory_gib)
        require(self.tokenizer is None or bool(self.tokenizer), "model.tokenizer",
                "a tokenizer directory, a preset name or null", self.tokenizer)
        if self.cost_model is not None:
            self.cost_model = cost_model_file(self.cost_model, "model.cost_model")  # the file it names, once
        require(self.op_split_every >= 0, "model.op_split_every", "an integer >= 0 (0: never)", self.op_split_every)
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            require(getattr(self, key) >= 1, f"model.{key}", "an integer >= 1", getattr(self, key))


@dataclass
class SchedulerGroup:
    """The ``scheduler`` group (conf/scheduler/)."""

    name: str
    max_num_seqs: int
    max_num_batched_tokens: int

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            require(getattr(self, key) >= 1, f"scheduler.{key}", "an integer >= 1", getattr(self, key))


def engine_config(model: ModelGroup, scheduler: SchedulerGroup, chunk_size: int | None) -> EngineConfig:
    """The engine of the ``model`` and ``scheduler`` groups. ``chunk_size`` None leaves the engine's default
    (policies that do not chunk ignore it)."""
    sched = SchedulerConfig(policy=scheduler.name, max_num_seqs=scheduler.max_num_seqs,
                            max_num_batched_tokens=scheduler.max_num_batched_tokens)
    if chunk_size is not None:
        require(is_int(chunk_size) and chunk_size >= 1, "chunk_size", "an integer >= 1", chunk_size)
        sched.chunk_size = chunk_size
    return EngineConfig(
        model=ModelConfig(
            model=model.name if model.path is None else str(Path(model.name).expanduser()), dtype=model.dtype,
            device=model.device, max_model_len=model.max_model_len, attention_backend=model.attention_backend,
            runner=model.runner, cost_model=model.cost_model,
            clock=model.clock, cuda_graphs=model.cuda_graphs,
            tokenizer=None if model.tokenizer is None else str(Path(model.tokenizer).expanduser()),
            skip_tokenizer_init=model.skip_tokenizer_init, deployment=model.deployment,
            op_split_every=model.op_split_every, adaptive_cpu_threads=model.adaptive_cpu_threads),
        cache=CacheConfig(kv_memory_gib=1.0 if model.kv_memory_gib is None else model.kv_memory_gib),
        scheduler=sched, parallel=ParallelConfig(model.tensor_parallel_size, model.pipeline_parallel_size))


def typed(schema: type[T], data: Mapping, prefix: str = "") -> T:
    """``data`` (plain containers, interpolations resolved) as a ``schema`` dataclass, checked once: a value
    of the wrong type, an unknown or a missing key is a one-line ConfigError naming ``prefix`` + its key,
    and each dataclass checks its ranges in ``__post_init__``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))
    except ConfigKeyError as e:
        raise ConfigError(f"{prefix}{e.full_key}: unknown key") from None
    except MissingMandatoryValue as e:
        raise ConfigError(f"{prefix}{e.full_key} is required (set {prefix}{e.full_key}=...)") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{prefix}{e.full_key} must be {_rule(schema, e.full_key)}, got {e.value!r}") from None


def _rule(schema: type, key: str) -> str:
    """What the annotation of ``key`` (dotted, below ``schema``) accepts, in words."""
    annotation: Any = schema
    for part in key.split("."):
        hints = typing.get_type_hints(annotation) if dataclasses.is_dataclass(annotation) else {}
        annotation = hints.get(part)
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    kinds = [words.get(typing.get_origin(a) or a, "a mapping") for a in args if a is not type(None)]
    return " or ".join(kinds + ["null"] * (type(None) in args)) or "a valid value"


def serve_overrides(model: Mapping, scheduler: Mapping, server: Mapping) -> list[str]:
    """The ``stallfree-serve`` command line that serves these groups (``model.path`` is implied by its name)."""
    knobs = {f"model.{key}": value for key, value in model.items() if key != "path"}
    knobs |= {f"scheduler.{key}": value for key, value in scheduler.items()}
    knobs |= server
    return [override(key, value) for key, value in knobs.items()]


def compose(config_name: str, overrides: list[str], job_name: str) -> dict:
    """``conf/<config_name>.yaml`` with command-line overrides, resolved to plain containers."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name=job_name):
        cfg = hydra_compose(config_name=config_name, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def one_line(exc: BaseException) -> str:
    """A configuration or startup error as one line (Hydra's search-path notes and tracebacks left out)."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(exc).split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(exc, OmegaConfBaseException) and lines:
        return f"{exc.full_key}: {lines[0]}" if exc.full_key else lines[0]
    return " ".join(lines) or type(exc).__name__
