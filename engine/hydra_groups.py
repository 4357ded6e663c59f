"""The one mapping from the Hydra config groups under ``conf/`` to engine and server settings.

``stallfree-serve`` and ``stallfree-bench`` both compose ``conf/`` (the ``model`` and ``scheduler`` groups
plus their own keys). This module turns those groups into ``EngineConfig.from_kwargs`` arguments and
``ServerConfig`` fields, writes Hydra override values (one quoting rule), and checks values (one helper:
every error names its key). It needs no torch and no Hydra, so the load generator can import it cheaply.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SERVER_KEYS = ("host", "port", "api_key", "max_waiting", "max_body_bytes", "served_model_name",
               "timeout_graceful_shutdown", "log_level")


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


def engine_kwargs_from_groups(model: Mapping, scheduler: Mapping, chunk_size: int | None) -> dict:
    """``EngineConfig.from_kwargs`` arguments from the ``model`` and ``scheduler`` groups. ``chunk_size``
    None leaves the engine's default (policies that do not chunk ignore it)."""
    kwargs = dict(model=str(Path(model["name"]).expanduser()) if "path" in model else model["name"],
                  dtype=model["dtype"], device=model["device"], max_model_len=model["max_model_len"],
                  kv_memory_gib=model["kv_memory_gib"], attention_backend=model["attention_backend"],
                  runner=model["runner"], cost_model=model["cost_model"], clock=model["clock"],
                  scheduler=scheduler["name"], max_num_seqs=scheduler["max_num_seqs"],
                  max_num_batched_tokens=scheduler["max_num_batched_tokens"])
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
