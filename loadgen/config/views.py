"""Views of a BenchConfig that several parts of a run share: the identity of its engine, stable digests,
the model's vocabulary and the workload's tokenizer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from stallfree.engine import SCHEDULERS
from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.config.schema import BenchConfig

# (section, field, default) of EngineConfig fields newer than the run ids (engine_identity).
FIELDS_SINCE_RUN_IDS = (("cache", "enable_prefix_caching", False), ("parallel", "disaggregation", None),
                        ("parallel", "data_parallel_size", 1), ("parallel", "router", "least_outstanding"))
# (group, field, default) of the bench's measured groups newer than the run ids (loadgen.sweep.plan)
BENCH_FIELDS_SINCE_RUN_IDS = (("arrival", "max_concurrency", None), ("arrival", "ramp_up_strategy", None),
                              ("arrival", "ramp_up_start_qps", None), ("arrival", "ramp_up_end_qps", None))


def chunk_size(cfg: BenchConfig) -> int | None:
    """The chunk size the run's policy uses; None for policies that ignore it."""
    return cfg.scheduler.chunk_size if SCHEDULERS[cfg.scheduler.policy].chunked else None


def engine_identity(cfg: BenchConfig) -> dict:
    """The run's engine as what tells one from another: every field of its EngineConfig, with the chunk
    size None for policies that ignore it (``scheduler=vllm scheduler.chunk_size=256,512`` is one engine).
    Fields added since run ids were first made count only away from their defaults, so the runs measured
    before them keep their ids."""
    engine = dataclasses.asdict(cfg.engine_sections())
    engine["scheduler"]["chunk_size"] = chunk_size(cfg)
    for section, key, default in FIELDS_SINCE_RUN_IDS:
        if engine[section][key] == default:
            del engine[section][key]
    return engine


def without_new_defaults(measured: dict) -> dict:
    """The bench's measured groups without the fields newer than the run ids left at their defaults, so the
    runs measured before them keep their ids."""
    return {group: {k: v for k, v in settings.items()
                    if (group, k, v) not in BENCH_FIELDS_SINCE_RUN_IDS} if isinstance(settings, dict) else settings
            for group, settings in measured.items()}


def digest(value) -> str:
    """A short stable hash of a JSON-able value (dict key order does not matter)."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _model_path(cfg: BenchConfig):
    from stallfree.engine import resolve_model_path

    try:
        return resolve_model_path(cfg.model.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def workload_tokenizer(cfg: BenchConfig):
    """The tokenizer that counts a text workload's tokens: ``workload.tokenizer`` (a directory), by
    default the run's model's; None for workloads of token ids."""
    from stallfree.loadgen.workload.request_specs import is_text_workload
    from stallfree.loadgen.workload.text_prompts import load_tokenizer

    if not is_text_workload(cfg.workload.lengths):
        return None
    return load_tokenizer(str(cfg.workload.tokenizer or _model_path(cfg)))


def prompt_tokenizer_dir(cfg: BenchConfig) -> str:
    """The tokenizer that writes an HTTP target's text prompts of a workload's lengths: ``target.tokenizer``,
    else ``workload.tokenizer``, else the run's model's."""
    if cfg.target.tokenizer or cfg.workload.tokenizer:
        return str(cfg.target.tokenizer or cfg.workload.tokenizer)
    try:
        return str(_model_path(cfg))
    except ConfigError as e:
        raise ConfigError(f"target.tokenizer: text prompts need a tokenizer ({e}); set target.tokenizer=DIR, "
                          "or target.token_ids=true for a server that takes token ids") from None


def model_vocab_size(cfg: BenchConfig) -> int:
    """The vocabulary of the run's model (prompt token ids are drawn below it), from its config.json or,
    for a simulated deployment, its model shape."""
    if cfg.model.deployment is not None:
        from stallfree.engine import Deployment

        return int(Deployment.from_config(cfg.model.deployment).resolve().shape.vocab_size)
    return int(json.loads((_model_path(cfg) / "config.json").read_text())["vocab_size"])
