"""Bench config validation: every config error becomes one line naming the key (exit code 2).

``validate_cli`` composes the config of every value a command line sweeps (each swept value once,
not the whole product), including the sweep presets of ``+experiment=...``, and checks each one, so a
sweep fails before its first run instead of Hydra printing a multi-line report or a traceback.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from stallfree.engine.hydra_groups import (
    CONF_DIR,
    ConfigError,
    check_model_group,
    cost_model_file,
    is_int,
    is_number,
    require,
)
from stallfree.loadgen.results.request_metrics import parse_goodput

CONFIG_NAME = "bench"
MODES = ("run", "capacity", "study")
RERUN = ("none", "disturbed", "all")
STAND_IN_VOCAB = 32000  # the workload is only built to validate it; token ids do not matter here


def _positive(cfg: DictConfig, key: str, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if not (optional and value is None):
        require(is_number(value) and value > 0, key, "a number > 0" + (" or null" if optional else ""), value)


def check(cfg: DictConfig) -> None:
    """Raise ConfigError for the first bad setting of a composed bench config."""
    missing = _missing_keys(OmegaConf.to_container(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required (set {missing[0]}=...)")
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{e.full_key}: {str(e).splitlines()[0]}") from None
    require(cfg.mode in MODES, "mode", f"one of {list(MODES)}", cfg.mode)
    require(cfg.rerun in RERUN, "rerun", f"one of {list(RERUN)}", cfg.rerun)
    _positive(cfg, "qps")
    for key in ("chunk_size", "num_requests", "repeats"):
        require(is_int(cfg[key]) and cfg[key] >= 1, key, "an integer >= 1", cfg[key])
    require(is_int(cfg.seed), "seed", "an integer", cfg.seed)
    require(is_int(cfg.warmup) and 0 <= cfg.warmup < cfg.num_requests, "warmup",
          f"an integer in [0, num_requests={cfg.num_requests})", cfg.warmup)
    check_model_group(OmegaConf.to_container(cfg.model, resolve=True))
    require(cfg.model.clock == "real" or cfg.target.kind == "inprocess", "model.clock",
          "'real' unless target=inprocess (a server's virtual time means nothing to a client)", cfg.model.clock)
    _positive(cfg, "slo.tbt_ms", optional=True)
    _positive(cfg, "slo.tbt_multiple")
    share = cfg.min_engine_cpu_share
    require(is_number(share) and 0 <= share <= 1, "min_engine_cpu_share", "a number in [0, 1]", share)
    _positive(cfg, "slo.ttft_ms", optional=True)
    try:
        parse_goodput(OmegaConf.select(cfg, "slo.goodput"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _positive(cfg, "target.timeout_s")
    _check_endpoint(cfg)
    cap = OmegaConf.select(cfg, "target.max_in_flight")
    require(cap is None or (is_int(cap) and cap >= 1), "target.max_in_flight", "an integer >= 1 or null", cap)
    for key in ("num_seqs", "prompt_tokens", "output_tokens", "rounds", "attempts"):
        value = cfg.decode_probe[key]
        require(is_int(value) and value >= 1, f"decode_probe.{key}", "an integer >= 1", value)
    q = cfg.decode_probe.quantile
    require(is_number(q) and 0 <= q <= 1, "decode_probe.quantile", "a number in [0, 1]", q)
    _positive(cfg, "decode_probe.max_spread")
    _positive(cfg, "slo.reference_ms", optional=True)
    path = OmegaConf.select(cfg, "slo.reference_cost_model")
    if path is not None:
        cost_model_file(path, "slo.reference_cost_model")
    for key in ("start_qps", "min_qps", "max_qps", "tolerance", "max_p50_scheduling_delay_s"):
        _positive(cfg, f"capacity.{key}")
    c = cfg.capacity
    require(c.min_qps <= c.start_qps <= c.max_qps, "capacity.start_qps",
          f"within [capacity.min_qps={c.min_qps}, capacity.max_qps={c.max_qps}]", c.start_qps)
    _check_workload(cfg)
    _check_results_dir(Path(str(cfg.results_dir)))


def _check_results_dir(path: Path) -> None:
    """results_dir must be a directory this process can create and write in."""
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    require(existing.is_dir() and os.access(existing, os.W_OK | os.X_OK), "results_dir",
            f"a directory you can write in ({existing} is {'not writable' if existing.is_dir() else 'a file'})",
            str(path))


def _check_endpoint(cfg: DictConfig) -> None:
    from stallfree.loadgen.openai_client.completions import ENDPOINT_PATHS
    from stallfree.loadgen.workload.request_specs import is_text_workload

    endpoint = OmegaConf.select(cfg, "target.endpoint")
    if endpoint is None:  # target=inprocess: no HTTP
        return
    require(endpoint in ENDPOINT_PATHS, "target.endpoint", f"one of {sorted(ENDPOINT_PATHS)}", endpoint)
    text = is_text_workload(OmegaConf.to_container(cfg.workload.lengths, resolve=True))
    require(endpoint != "chat" or text, "target.endpoint", "completions for a workload of token ids "
            "(chat needs a text workload: sharegpt, jsonl, sonnet)", endpoint)


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Keys left at ``???``, without resolving interpolations (which would fail on them first)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _missing_keys(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if node == "???" else []


class StandInTokenizer:
    """One token per word: text workloads are only built to validate them here, and a real tokenizer
    gives at least as many tokens, so nothing that fits is rejected for its length."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(word) for word in text.split()]


def _check_workload(cfg: DictConfig) -> None:
    from stallfree.loadgen.workload.request_specs import build_workload

    tokenizer = cfg.workload.get("tokenizer")
    require(tokenizer is None or Path(tokenizer).expanduser().is_dir(), "workload.tokenizer",
            "a tokenizer directory or null", tokenizer)
    try:
        build_workload(OmegaConf.to_container(cfg.arrival, resolve=True),
                       OmegaConf.to_container(cfg.workload.lengths, resolve=True), cfg.num_requests,
                       cfg.seed, STAND_IN_VOCAB, cfg.workload.max_total_tokens, tokenizer=StandInTokenizer())
    except ValueError as e:
        message = str(e)  # "lengths.*" and "max_total_tokens" live in the workload group
        prefix = "workload." if message.startswith(("lengths", "max_total")) else ""
        raise ConfigError(prefix + message) from None


# ------------------------------------------------------------------------------------- command line


def _overrides(argv: Sequence[str]) -> list[str]:
    """The ``key=value`` overrides of a command line, without Hydra's own (hydra.*, hydra/...)."""
    return [a for a in argv if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]


def _variants(overrides: list[str]) -> list[list[str]]:
    """One override list per swept value: every other sweep at its first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for override in overrides:
        try:
            parsed += parser.parse_overrides([override])
        except HydraException as e:
            raise ConfigError(f"{override}: {str(e).splitlines()[0]}") from None
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    base = [values[0] for values in choices]
    variants = [base]
    for i, values in enumerate(choices):
        variants += [[*base[:i], value, *base[i + 1:]] for value in values[1:]]
    return variants


def _composition_error(e: Exception) -> ConfigError:
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return ConfigError(f"{group}: unknown option {option!r} (choose from: {', '.join(e.options)})")
    if str(e).startswith("Error merging override") and e.__cause__ is not None:  # the cause names key and value
        return ConfigError(f"{str(e).split()[-1]}: {str(e.__cause__).splitlines()[0]}")
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    match = re.match(r"Could not override '([^']+)'", lines[0]) if lines else None
    if match and len(lines) > 1 and lines[1].startswith("To append"):
        return ConfigError(f"{match.group(1)}: unknown key ({lines[1]})")
    return ConfigError(" ".join(lines).split(" Config search path:")[0] or type(e).__name__)


def validate_cli(argv: Sequence[str]) -> None:
    """Compose and check the configs a command line would run; raise ConfigError on the first problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="stallfree-bench"):
        try:
            cli = _overrides(argv)
            # Hydra checks its own launcher choice and keys when they compose with its config.
            launcher = [a for a in argv if a.lstrip("+~").startswith(("hydra/launcher=", "hydra.launcher."))]
            preset = OmegaConf.select(compose(CONFIG_NAME, _variants(cli)[0] + launcher, return_hydra_config=True),
                                      "hydra.sweeper.params") or {}
            cli_keys = {o.split("=", 1)[0].lstrip("+~") for o in cli}
            swept = [f"{key}={value}" for key, value in preset.items() if key not in cli_keys]
            for overrides in _variants(cli + swept):
                check(compose(CONFIG_NAME, overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise _composition_error(e) from None
