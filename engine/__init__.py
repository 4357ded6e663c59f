"""stallfree inference engine: paged KV cache, Llama-family model, switchable scheduling policies."""
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.outputs import BatchRecord, RequestOutput
from engine.request import RequestMetrics, RequestStatus, SamplingParams
from engine.scheduler import SCHEDULERS

__all__ = ["LLM", "LLMEngine", "EngineConfig", "ModelConfig", "CacheConfig", "SchedulerConfig", "SamplingParams",
           "RequestOutput", "RequestMetrics", "RequestStatus", "BatchRecord", "SCHEDULERS"]
