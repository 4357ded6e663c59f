"""The Hydra configs under ``conf/`` and the engine's config dataclasses (engine/config.py), which are
their schema.

``stallfree-serve``, ``stallfree-bench`` and ``stallfree-profile`` compose ``conf/``: each starts from
``engine_schema`` (``register_schema``: every section of EngineConfig with its defaults), the ``model``
presets and ``scheduler`` policies set some of its keys, and each command adds keys of its own. This
module registers that schema, turns a composed config into dataclasses once at an entry point (``typed``:
every error one line naming its key) and writes Hydra override values (one quoting rule). It needs no
torch, and imports Hydra only when it composes, so the load generator can import it cheaply.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import json
import logging
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from stallfree.engine.config import EngineConfig
from stallfree.engine.config_checks import ConfigError, require

# The Hydra configs ship as package data of stallfree.conf (the conf/ folder): found the same way from a
# checkout, an editable install or a wheel.
CONF_DIR = Path(str(importlib.resources.files("stallfree.conf")))
# Cost models committed with the package (engine/simulator/fitting/cost_models/), named by file name in a setting.
COST_MODELS_DIR = Path(str(importlib.resources.files("stallfree.engine"))) / "simulator" / "fitting" / "cost_models"
OLD_COST_MODELS_DIR = "engine/fitting/cost_models"  # their folder before fitting moved into the simulator (CHANGELOG)
SCHEMA_NAME = "engine_schema"  # the first entry of conf/serve.yaml's, bench.yaml's and profile.yaml's defaults
T = TypeVar("T")
logger = logging.getLogger("stallfree.engine")


def override(key: str, value: object) -> str:
    """``key=value`` as a Hydra command-line override that Hydra reads back as exactly ``value``:
    numbers, booleans and null as such, strings quoted literally (commas, '=', quotes, backslashes),
    mappings and lists of those."""
    return f"{key}={_hydra_value(value)}"


def _hydra_value(value: object) -> str:
    if isinstance(value, str):
        # Hydra's rule inside single quotes: a quote, and any backslashes right before a quote or the end,
        # get a backslash each.
        quoted = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), value)
        return f"'{quoted}'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return "null" if value is None else json.dumps(value)


def cost_model_file(value: object, key: str) -> str:
    """The cost model JSON a setting names: a file (relative to where you run), or the file name of one
    committed with the package (COST_MODELS_DIR)."""
    committed = sorted(p.name for p in COST_MODELS_DIR.glob("*.json"))
    if isinstance(value, str) and Path(value).expanduser().is_file():
        return str(Path(value).expanduser())
    if isinstance(value, str) and Path(value).parent.as_posix().endswith(OLD_COST_MODELS_DIR):
        logger.warning("%s: %s moved to %s; reading the committed %s", key, OLD_COST_MODELS_DIR,
                       "engine/simulator/fitting/cost_models", Path(value).name)
        value = Path(value).name
    require(isinstance(value, str) and value in committed, key, f"a cost model JSON file or one of {committed}",
            value)
    return str(COST_MODELS_DIR / value)


def register_schema() -> None:
    """Store EngineConfig's sections, with their defaults, in Hydra's ConfigStore as ``engine_schema``: the
    commands' configs start from it, so every engine field is a key (``cache.block_size=32``) that Hydra
    type-checks as it composes, and ``--cfg job`` shows it. ``model.model`` has no default there: a preset
    of conf/model/ names it (``model=path``: ``model.model=DIR``); a ``???`` merged over a default would
    leave the default."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import MISSING

    schema = {f.name: f.default_factory() for f in dataclasses.fields(EngineConfig)}
    schema["model"].model = MISSING
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema)


def check_engine(config: EngineConfig) -> None:
    """What an EngineConfig made from a composed config needs beyond its sections' own range checks (each
    section's ``__post_init__``): ``model.cost_model`` must name a file or a committed cost model (kept as given:
    run ids hash it, and the runner resolves it), and ``~`` in paths becomes the home directory. Choices the
    engine makes itself (dtype, device, backend, runner, clock, policy) are checked by the engine as it starts."""
    model = config.model
    model.model = str(Path(model.model).expanduser())
    if model.tokenizer is not None:
        model.tokenizer = str(Path(model.tokenizer).expanduser())
    if model.cost_model is not None:
        cost_model_file(model.cost_model, "model.cost_model")


def engine_of(composed: Mapping) -> EngineConfig:
    """The EngineConfig of a composed config (its sections at the top level), checked once."""
    config = typed(EngineConfig, {f.name: composed[f.name] for f in dataclasses.fields(EngineConfig)})
    check_engine(config)
    return config


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


def serve_overrides(engine: EngineConfig, server: Mapping) -> list[str]:
    """The ``stallfree-serve`` command line that serves this engine: every field, as ``<section>.<field>``."""
    knobs = {f"{section}.{key}": value for section, values in dataclasses.asdict(engine).items()
             for key, value in values.items()}
    return [override(key, value) for key, value in (knobs | dict(server)).items()]


def compose(config_name: str, overrides: list[str], job_name: str) -> dict:
    """``conf/<config_name>.yaml`` with command-line overrides, resolved to plain containers."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name=job_name):
        try:
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException) as e:
            raise composition_error(e) from None
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required (set {e.full_key}=...)") from None


def composition_error(e: Exception) -> ConfigError:
    """A Hydra composition error as one line naming the key (an unknown group option, a value of the wrong
    type, an unknown key: with the engine key of that name, where there is one)."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ValidationError

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return ConfigError(f"{group}: unknown option {option!r} (choose from: {', '.join(e.options)})")
    if str(e).startswith("Error merging override") and e.__cause__ is not None:  # the cause names key and value
        key, _, value = str(e).split()[-1].partition("=")
        sections = {f.name for f in dataclasses.fields(EngineConfig)}
        if isinstance(e.__cause__, ValidationError) and key.split(".")[0] in sections:  # an engine key's type
            return ConfigError(f"{key} must be {_rule(EngineConfig, key)}, got {value!r}")
        return ConfigError(f"{key}: {str(e.__cause__).splitlines()[0]}")
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    match = re.match(r"Could not override '([^']+)'", lines[0]) if lines else None
    if match and len(lines) > 1 and lines[1].startswith("To append"):
        key = match.group(1)
        engine_keys = [f"{section.name}.{key}" for section in dataclasses.fields(EngineConfig)
                       if key in {f.name for f in dataclasses.fields(section.default_factory)}]
        hint = f"did you mean {' or '.join(engine_keys)}?" if engine_keys else lines[1]
        return ConfigError(f"{key}: unknown key ({hint})")
    return ConfigError(" ".join(lines).split(" Config search path:")[0] or type(e).__name__)


def one_line(exc: BaseException) -> str:
    """A configuration or startup error as one line (Hydra's search-path notes and tracebacks left out)."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(exc).split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(exc, OmegaConfBaseException) and lines:
        return f"{exc.full_key}: {lines[0]}" if exc.full_key else lines[0]
    return " ".join(lines) or type(exc).__name__
