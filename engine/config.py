"""Engine configuration dataclasses."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class ModelConfig:
    model: str = "tiny"  # preset name or path to an HF checkpoint directory
    dtype: str = "auto"  # auto | bfloat16 | float32 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_model_len: int | None = None  # default: the checkpoint's max_position_embeddings (capped at 4096)
    seed: int = 0  # sampling seed for requests without their own
    attention_backend: str = "auto"  # auto | sdpa | cpu_paged | flash_attn | triton
    runner: str = "model"  # model (real forward pass) | simulated (engine/simulator.py: a fitted cost model)
    cost_model: str | None = None  # simulated: a CostModel JSON; None: profile this model's real runner once
    clock: str = "real"  # simulated: real (iterations sleep) | virtual (offline, time is a counter)
    cuda_graphs: bool = True  # CUDA: replay decode-only steps from CUDA graphs (graph-safe backends: triton)
    tokenizer: str | None = None  # a tokenizer directory or preset name; None: the model directory's own
    skip_tokenizer_init: bool = False  # no tokenizer: token-id prompts only, outputs carry no text (vLLM's flag)
    op_split_every: int = 0  # time linear layers and attention every Nth iteration (0: never; engine/utilization)


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
