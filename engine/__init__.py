"""stallfree inference engine: paged KV cache, Llama-family model, switchable scheduling policies.

The public API. Names load on first use, so that ``stallfree.engine.hydra_config`` (the Hydra config mapping the
load generator shares) imports without pulling in torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "LLM": "stallfree.engine.llm", "LLMEngine": "stallfree.engine.engine",
    "EngineConfig": "stallfree.engine.config", "ModelConfig": "stallfree.engine.config", "CacheConfig": "stallfree.engine.config",
    "SchedulerConfig": "stallfree.engine.config", "ParallelConfig": "stallfree.engine.config",
    "SamplingParams": "stallfree.engine.request", "RequestMetrics": "stallfree.engine.request", "RequestStatus": "stallfree.engine.request",
    "RequestOutput": "stallfree.engine.outputs", "BatchRecord": "stallfree.engine.records",
    "TokenLogprob": "stallfree.engine.request",
    "SCHEDULERS": "stallfree.engine.scheduler", "resolve_model_path": "stallfree.engine.model.presets",
    "CostModel": "stallfree.engine.simulator.fitting.cost_model", "IterationFeatures": "stallfree.engine.simulator.fitting.cost_model",
    "profile_cost_model": "stallfree.engine.simulator.fitting.profile", "check_speed": "stallfree.engine.simulator.fitting.speed_check",
    "first_lone_surrogate": "stallfree.engine.tokenizer", "choose_dtype": "stallfree.engine.device",
    "Deployment": "stallfree.engine.simulator.deployment",
}
__all__ = ["LLM", "LLMEngine", "EngineConfig", "ModelConfig", "CacheConfig", "SchedulerConfig", "ParallelConfig",
           "SamplingParams",
           "RequestMetrics", "RequestStatus", "RequestOutput", "TokenLogprob", "BatchRecord", "SCHEDULERS", "resolve_model_path",
           "CostModel", "IterationFeatures", "profile_cost_model", "check_speed", "first_lone_surrogate",
           "choose_dtype", "Deployment"]

if TYPE_CHECKING:
    from stallfree.engine.config import (
        CacheConfig,
        EngineConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
    )
    from stallfree.engine.device import choose_dtype
    from stallfree.engine.engine import LLMEngine
    from stallfree.engine.llm import LLM
    from stallfree.engine.model.presets import resolve_model_path
    from stallfree.engine.outputs import RequestOutput
    from stallfree.engine.records import BatchRecord
    from stallfree.engine.request import RequestMetrics, RequestStatus, SamplingParams, TokenLogprob
    from stallfree.engine.scheduler import SCHEDULERS
    from stallfree.engine.simulator.deployment import Deployment
    from stallfree.engine.simulator.fitting.cost_model import CostModel, IterationFeatures
    from stallfree.engine.simulator.fitting.profile import profile_cost_model
    from stallfree.engine.simulator.fitting.speed_check import check_speed
    from stallfree.engine.tokenizer import first_lone_surrogate


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
