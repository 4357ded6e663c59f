"""Engine configuration dataclasses."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass
class ModelConfig:
    model: str = "tiny"  # preset name or path to an HF checkpoint directory
    dtype: str = "auto"  # auto | bfloat16 | float32 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_model_len: int | None = None  # default: the checkpoint's max_position_embeddings (capped at 4096)
    seed: int = 0  # sampling seed for requests without their own
    attention_backend: str = "auto"  # auto | sdpa | cpu_paged | flash_attn
    runner: str = "model"  # model (real forward pass) | simulated (engine/simulator.py: a fitted cost model)
    cost_model: str | None = None  # simulated: a CostModel JSON; None: profile this model's real runner once
    clock: str = "real"  # simulated: real (iterations sleep) | virtual (offline, time is a counter)


@dataclass
class CacheConfig:
    block_size: int = 16
    kv_memory_gib: float = 1.0  # KV cache budget on CPU (and on CUDA unless gpu_memory_utilization is set)
    gpu_memory_utilization: float | None = None  # CUDA: fraction of free memory for the KV cache
    num_blocks: int | None = None  # overrides the memory budget (tests)
    watermark: float = 0.01  # fraction of blocks kept free when admitting new prefills


@dataclass
class SchedulerConfig:
    policy: str = "sarathi"
    chunk_size: int = 512  # token budget per iteration (sarathi, chunked_prefill)
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 4096  # token budget of the vllm policy


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """Build from flat knobs (``model=``, ``scheduler=``, ``chunk_size=``, ...), vLLM style."""
        sections = {"model": ModelConfig(), "cache": CacheConfig(), "scheduler": SchedulerConfig()}
        aliases = {"scheduler": "policy"}
        for key, value in kwargs.items():
            name = aliases.get(key, key)
            target = next((s for s in sections.values() if name in {f.name for f in fields(s)}), None)
            if target is None:
                raise ValueError(f"unknown engine option {key!r}")
            setattr(target, name, value)
        return cls(**sections)


def engine_kwargs_from_groups(model: Mapping, scheduler: Mapping, chunk_size: int | None) -> dict:
    """``EngineConfig.from_kwargs`` arguments from the Hydra ``model`` and ``scheduler`` groups (conf/)."""
    kwargs = dict(model=str(Path(model["name"]).expanduser()) if "path" in model else model["name"],
                  dtype=model["dtype"], device=model["device"], max_model_len=model["max_model_len"],
                  kv_memory_gib=model["kv_memory_gib"], attention_backend=model["attention_backend"],
                  runner=model["runner"], cost_model=model["cost_model"], clock=model["clock"],
                  scheduler=scheduler["name"], max_num_seqs=scheduler["max_num_seqs"],
                  max_num_batched_tokens=scheduler["max_num_batched_tokens"])
    return kwargs if chunk_size is None else {**kwargs, "chunk_size": chunk_size}
