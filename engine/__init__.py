"""stallfree inference engine: paged KV cache, Llama-family model, switchable scheduling policies.

The public API. Names load on first use, so that ``engine.hydra_groups`` (the Hydra config mapping the
load generator shares) imports without pulling in torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "LLM": "engine.llm", "LLMEngine": "engine.engine",
    "EngineConfig": "engine.config", "ModelConfig": "engine.config", "CacheConfig": "engine.config",
    "SchedulerConfig": "engine.config",
    "SamplingParams": "engine.request", "RequestMetrics": "engine.request", "RequestStatus": "engine.request",
    "RequestOutput": "engine.outputs", "BatchRecord": "engine.outputs",
    "SCHEDULERS": "engine.scheduler", "resolve_model_path": "engine.model.presets",
    "CostModel": "engine.runner.cost_model", "profile_cost_model": "engine.runner.profile",
    "first_lone_surrogate": "engine.tokenizer",
}
__all__ = ["LLM", "LLMEngine", "EngineConfig", "ModelConfig", "CacheConfig", "SchedulerConfig", "SamplingParams",
           "RequestMetrics", "RequestStatus", "RequestOutput", "BatchRecord", "SCHEDULERS", "resolve_model_path",
           "CostModel", "profile_cost_model", "first_lone_surrogate"]

if TYPE_CHECKING:
    from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.llm import LLM
    from engine.model.presets import resolve_model_path
    from engine.outputs import BatchRecord, RequestOutput
    from engine.request import RequestMetrics, RequestStatus, SamplingParams
    from engine.runner.cost_model import CostModel
    from engine.runner.profile import profile_cost_model
    from engine.scheduler import SCHEDULERS
    from engine.tokenizer import first_lone_surrogate


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
