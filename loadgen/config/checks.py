"""Bench config validation at the entry point: the composed config becomes a BenchConfig
(loadgen.config.schema) or one line naming the key (exit code 2).

``validate_cli`` composes the config of every value a command line sweeps (each swept value once,
not the whole product), including the sweep presets of ``+experiment=...``, and checks each one, so a
sweep fails before its first run instead of Hydra printing a multi-line report or a traceback.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import CONF_DIR, composition_error, register_schema
from stallfree.engine.records.writable import ResultsDirError, probe_writable
from stallfree.loadgen.config.schema import BenchConfig, load_bench

CONFIG_NAME = "bench"
STAND_IN_VOCAB = 32000  # the workload is only built to validate it; token ids do not matter here


def check(cfg: DictConfig) -> BenchConfig:
    """A composed bench config as a BenchConfig, or ConfigError for its first bad setting: the schema's
    checks (loadgen.config.schema), then the workload is built once and results_dir probed."""
    bench = load_bench(cfg)
    _check_workload(bench)
    _check_results_dir(Path(bench.results_dir) / bench.experiment_name)
    return bench


def _check_results_dir(exp_dir: Path) -> None:
    """The experiment's directory (Hydra's own .hydra output goes there first) must be one this process can
    create and write in: a file is written there, so a read-only or full filesystem, /proc or a file in
    the path fail here, before any run."""
    try:
        probe_writable(exp_dir)
    except ResultsDirError as e:
        raise ConfigError(f"results_dir: {e}") from None


class StandInTokenizer:
    """One token per word: text workloads are only built to validate them here, and a real tokenizer
    gives at least as many tokens, so nothing that fits is rejected for its length."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(word) for word in text.split()]


def _check_workload(cfg: BenchConfig) -> None:
    from stallfree.loadgen.workload.request_specs import build_workload

    try:
        build_workload(cfg.arrival.settings(), cfg.workload.lengths, cfg.num_requests, cfg.seed, STAND_IN_VOCAB,
                       cfg.workload.max_total_tokens, tokenizer=StandInTokenizer())
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


def validate_cli(argv: Sequence[str]) -> None:
    """Compose and check the configs a command line would run; raise ConfigError on the first problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="stallfree-bench"):
        try:
            cli = _overrides(argv)
            # Hydra checks its own launcher choice and keys when they compose with its config.
            launcher = [a for a in argv if a.lstrip("+~").startswith(("hydra/launcher=", "hydra.launcher."))]
            preset = OmegaConf.select(compose(CONFIG_NAME, _variants(cli)[0] + launcher, return_hydra_config=True),
                                      "hydra.sweeper.params") or {}
            cli_keys = {o.split("=", 1)[0].lstrip("+~") for o in cli}
            swept = [f"{key}={value}" for key, value in preset.items() if key.lstrip("+~") not in cli_keys]
            for overrides in _variants(cli + swept):
                check(compose(CONFIG_NAME, overrides))
        except (HydraException, OmegaConfBaseException) as e:
            raise composition_error(e) from None
