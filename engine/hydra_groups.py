"""The one mapping from the Hydra config groups under ``conf/`` to engine and server settings.

``stallfree-serve`` and ``stallfree-bench`` both compose ``conf/`` (the ``model`` and ``scheduler`` groups
plus their own keys). This module turns those groups into ``EngineConfig.from_kwargs`` arguments and
``ServerConfig`` fields, writes Hydra override values (one quoting rule), and checks values (one helper:
every error names its key). It needs no torch and no Hydra, so the load generator can import it cheaply.
"""
from __future__ import annotations

import importlib.resources
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

# The Hydra configs ship as package data of stallfree.conf (the conf/ folder): found the same way from a
# checkout, an editable install or a wheel.
CONF_DIR = Path(str(importlib.resources.files("stallfree.conf")))
# Cost models committed with the package (engine/runner/cost_models/), named by file name in a setting.
COST_MODELS_DIR = Path(str(importlib.resources.files("stallfree.engine"))) / "runner" / "cost_models"
SERVER_KEYS = ("host", "port", "api_key", "metrics_require_api_key", "max_waiting", "max_body_bytes",
               "served_model_name", "timeout_graceful_shutdown", "log_level", "body_read_timeout_s",
               "header_read_timeout_s", "timeout_keep_alive_s", "batch_history_max_records",
               "batch_history_max_age_s")
# Names the engine checks itself when it starts (their choices live with the code that uses them).
MODEL_NAMES = ("dtype", "device", "attention_backend", "runner", "clock")


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


def check_model_group(model: Mapping) -> None:
    """Raise ConfigError for the first bad value of a composed ``model`` group (serve and bench alike):
    the checks that need no torch; unknown dtypes, devices, backends, runners and clocks are reported by
    the engine as it starts."""
    name = model.get("name")
    require(isinstance(name, str) and bool(name), "model.name", "a non-empty string", name)
    path = model.get("path")
    require(path is None or (isinstance(path, str) and Path(path).expanduser().is_dir()), "model.path",
            "a checkpoint directory", path)
    for key in MODEL_NAMES:
        require(isinstance(model.get(key), str) and bool(model.get(key)), f"model.{key}", "a non-empty string",
                model.get(key))
    max_len = model.get("max_model_len")
    require(max_len is None or (is_int(max_len) and max_len >= 2), "model.max_model_len", "an integer >= 2 or null",
            max_len)
    kv = model.get("kv_memory_gib")
    if model.get("deployment") is None:  # a deployment sizes its KV cache itself (engine/simulator/memory_plan.py)
        require(is_number(kv) and kv > 0, "model.kv_memory_gib", "a number > 0", kv)
    tokenizer = model.get("tokenizer")
    require(tokenizer is None or (isinstance(tokenizer, str) and bool(tokenizer)), "model.tokenizer",
            "a tokenizer directory, a preset name or null", tokenizer)
    if model.get("cost_model") is not None:
        cost_model_file(model["cost_model"], "model.cost_model")
    every = model.get("op_split_every", 0)
    require(is_int(every) and every >= 0, "model.op_split_every", "an integer >= 0 (0: never)", every)
    for key in ("skip_tokenizer_init", "cuda_graphs", "adaptive_cpu_threads"):
        require(isinstance(model.get(key, False), bool), f"model.{key}", "true or false", model.get(key))


def cost_model_file(value: object, key: str) -> str:
    """The cost model JSON a setting names: a file (relative to where you run), or the file name of one
    committed with the package (COST_MODELS_DIR)."""
    committed = sorted(p.name for p in COST_MODELS_DIR.glob("*.json"))
    if isinstance(value, str) and Path(value).expanduser().is_file():
        return str(Path(value).expanduser())
    require(isinstance(value, str) and value in committed, key, f"a cost model JSON file or one of {committed}",
            value)
    return str(COST_MODELS_DIR / value)


def engine_kwargs_from_groups(model: Mapping, scheduler: Mapping, chunk_size: int | None) -> dict:
    """``EngineConfig.from_kwargs`` arguments from the ``model`` and ``scheduler`` groups (checked with
    ``check_model_group``). ``chunk_size`` None leaves the engine's default (policies that do not chunk
    ignore it)."""
    check_model_group(model)
    tokenizer = model.get("tokenizer")
    kwargs = dict(model=str(Path(model["name"]).expanduser()) if "path" in model else model["name"],
                  dtype=model["dtype"], device=model["device"], max_model_len=model["max_model_len"],
                  kv_memory_gib=model.get("kv_memory_gib", 1.0), attention_backend=model["attention_backend"],
                  runner=model["runner"], cost_model=model["cost_model"] and cost_model_file(model["cost_model"], "model.cost_model"),
                  clock=model["clock"],
                  cuda_graphs=model.get("cuda_graphs", True),
                  scheduler=scheduler["name"], max_num_seqs=scheduler["max_num_seqs"],
                  max_num_batched_tokens=scheduler["max_num_batched_tokens"],
                  tokenizer=None if tokenizer is None else str(Path(tokenizer).expanduser()),
                  skip_tokenizer_init=model.get("skip_tokenizer_init", False),
                  deployment=model.get("deployment"),
                  op_split_every=model.get("op_split_every", 0),
                  adaptive_cpu_threads=model.get("adaptive_cpu_threads", True))
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        require(is_int(kwargs[key]) and kwargs[key] >= 1, f"scheduler.{key}", "an integer >= 1", kwargs[key])
    if chunk_size is not None:
        require(is_int(chunk_size) and chunk_size >= 1, "chunk_size", "an integer >= 1", chunk_size)
        kwargs["chunk_size"] = chunk_size
    return kwargs


def server_kwargs(cfg: Mapping) -> dict:
    """``ServerConfig`` fields from the server keys of ``conf/serve.yaml`` (a digit-string port is cast)."""
    kwargs = {key: cfg[key] for key in SERVER_KEYS}
    port = kwargs["port"]
    kwargs["port"] = int(port) if isinstance(port, str) and port.isdigit() else port
    kwargs["host"] = str(kwargs["host"])
    kwargs["api_key"] = None if kwargs["api_key"] is None else str(kwargs["api_key"])
    kwargs["served_model_name"] = kwargs["served_model_name"] or str(cfg["model"]["name"])
    return kwargs


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
