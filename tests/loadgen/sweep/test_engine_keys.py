"""Every field of EngineConfig is a key of both commands (``<section>.<field>``): set from the command
line, it reaches the engine's config unchanged, with nothing to keep in step by hand."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from stallfree.engine import EngineConfig, LLMEngine
from stallfree.engine.hydra_config import compose, override
from stallfree.engine.server.cli import _configs
from stallfree.loadgen.config.checks import check

BENCH = Path(sys.executable).parent / "stallfree-bench"


def engine_keys() -> dict[str, tuple[object, object]]:
    """Each engine key with its annotation and default, e.g. ``{"cache.block_size": (int, 16), ...}``."""
    return {f"{section.name}.{f.name}": (typing.get_type_hints(section.default_factory)[f.name],
                                         getattr(section.default_factory(), f.name))
            for section in dataclasses.fields(EngineConfig) for f in dataclasses.fields(section.default_factory)}


def other_value(key: str, annotation: object, default: object, tmp_path: Path, serve: bool) -> object:
    """A value of ``key`` other than its default that the config checks accept (the engine checks its
    choices, a device or a backend, only as it starts, and none starts here)."""
    cost_model = tmp_path / "cost-model.json"
    cost_model.write_text("{}")
    chosen = {"model.clock": "real" if serve else "virtual",  # a server runs on the real clock only
              "model.cost_model": str(cost_model), "model.deployment": {"gpu": "a100", "tp": 2}}
    if key in chosen:
        return chosen[key]
    kinds = set(typing.get_args(annotation)) or {annotation}
    if bool in kinds:
        return not default
    if float in kinds:  # fractions and budgets alike accept 0.5
        return 0.5 if default != 0.5 else 0.25
    if int in kinds:
        return 3 if default != 3 else 5
    return f"{key.split('.')[-1]}-set"


def overrides(values: dict[str, object]) -> list[str]:
    return [override(key, value) for key, value in values.items()]


def assert_reached(engine: EngineConfig, values: dict[str, object]) -> None:
    for key, value in values.items():
        section, name = key.split(".")
        assert getattr(getattr(engine, section), name) == value, key


# Keys whose other value needs others at theirs (a disaggregated deployment: one process per instance, a prefix
# cache), set on their own.
ALONE = {"parallel.disaggregation": {"parallel.disaggregation": "1p1d", "cache.enable_prefix_caching": True},
         "parallel.data_parallel_size": {"parallel.data_parallel_size": 2}}


def engine_config_of(values: dict[str, object], serve: bool, tmp_path: Path) -> EngineConfig:
    if serve:
        return _configs(overrides(values))[0]
    composed = compose("bench", [*overrides(values), f"results_dir={tmp_path}"], "test")
    return check(OmegaConf.create(composed)).engine_sections()


@pytest.mark.parametrize("serve", [True, False], ids=["stallfree-serve", "stallfree-bench"])
def test_every_engine_key_reaches_the_engine_config(serve, tmp_path):
    values = {key: other_value(key, *typed_default, tmp_path, serve) for key, typed_default in engine_keys().items()
              if key not in ALONE}
    assert_reached(engine_config_of(values, serve, tmp_path), values)
    for alone in ALONE.values():
        assert_reached(engine_config_of(alone, serve, tmp_path), alone)


def test_bench_cfg_job_shows_every_engine_key(tmp_path):
    done = subprocess.run([BENCH, "model=tiny", "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert {key for key in engine_keys() if key.split(".")[1] in shown[key.split(".")[0]]} == set(engine_keys())


def test_cache_keys_reach_a_built_engine():
    """The keys no command could set before reach an engine built from stallfree-serve's config."""
    values = {"cache.block_size": 32, "cache.num_blocks": 24, "cache.watermark": 0.05, "model.seed": 7}
    engine_config, _ = _configs([*overrides(values), "model.dtype=float32", "model.device=cpu"])
    engine = LLMEngine.from_config(engine_config)
    assert_reached(engine.config, values)
    assert engine.num_total_blocks == 24
