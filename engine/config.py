"""Engine configuration dataclasses.

They are also the schema of the Hydra configs under ``conf/``: ``stallfree-serve``, ``stallfree-bench``
and ``stallfree-profile`` compose each field as the key ``<section>.<field>`` (``cache.block_size``;
engine.hydra_config.register_schema), so a field added here is a key of every command. Each section checks
its ranges in ``__post_init__`` (a ConfigError naming the key), however it is made: from a composed config or
from ``LLM(...)``'s keyword arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from stallfree.engine.config_checks import ConfigError, is_number, require

# Names the engine checks itself when it starts (their choices live with the code that uses them).
MODEL_NAMES = ("model", "dtype", "device", "attention_backend", "runner", "clock")
DISAGGREGATIONS = (None, "1p1d")  # parallel.disaggregation: one prefill instance and one decode instance


@dataclass
class ModelConfig:
    model: str = "tiny"  # preset name or path to an HF checkpoint directory
    dtype: str = "auto"  # auto | bfloat16 | float32 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_model_len: int | None = None  # default: the checkpoint's max_position_embeddings (capped at 4096)
    seed: int = 0  # sampling seed for requests without their own
    attention_backend: str = "auto"  # auto | sdpa | cpu_paged | flash_attn | triton
    runner: str = "model"  # model (real forward pass) | simulated (engine/simulator/simulated_runner.py: a cost model)
    # simulated: a CostModel JSON file (or the file name of one committed with the package); None: profile this
    # model's real runner once
    cost_model: str | None = None
    clock: str = "real"  # simulated: real (iterations sleep) | virtual (offline, time is a counter)
    cuda_graphs: bool = True  # CUDA: replay decode-only steps from CUDA graphs (graph-safe backends: triton)
    tokenizer: str | None = None  # a tokenizer directory or preset name; None: the model directory's own
    skip_tokenizer_init: bool = False  # no tokenizer: token-id prompts only, outputs carry no text (vLLM's flag)
    # Any, not dict | None: OmegaConf cannot merge a mapping into an Optional[Dict] that is None, which
    # model.deployment={...} on the command line does.
    deployment: Any = None  # simulated: a GPU deployment (a mapping: engine/simulator/deployment.py) instead of a checkpoint and a fitted cost model
    op_split_every: int = 0  # time linear layers and attention every Nth iteration (0: never; engine/utilization)
    # CPU: run each iteration with the cores other processes leave free (engine/runner/cpu_threads.py);
    # false: torch's fixed thread count
    adaptive_cpu_threads: bool = True

    def __post_init__(self) -> None:
        for key in MODEL_NAMES:
            require(bool(getattr(self, key)), f"model.{key}", "a non-empty string", getattr(self, key))
        require(self.tokenizer is None or bool(self.tokenizer), "model.tokenizer",
                "a tokenizer directory, a preset name or null", self.tokenizer)
        require(self.max_model_len is None or self.max_model_len >= 2, "model.max_model_len",
                "an integer >= 2 or null", self.max_model_len)
        require(self.op_split_every >= 0, "model.op_split_every", "an integer >= 0 (0: never)", self.op_split_every)


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    kv_memory_gib: float = 1.0  # KV cache budget on CPU (and of the simulated runner)
    # CUDA: the fraction of the GPU's TOTAL memory the engine may use (weights, activations, graphs and the
    # KV cache, sized from measured memory as vLLM does); None: 0.9
    gpu_memory_utilization: float | None = None
    num_blocks: int | None = None  # overrides the memory budget (tests)
    watermark: float = 0.01  # fraction of blocks kept free when admitting new prefills
    # share the KV blocks of prompt prefixes seen before and skip their prefill (engine/prefix_cache.py)
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        require(self.block_size >= 1, "cache.block_size", "an integer >= 1", self.block_size)
        require(is_number(self.kv_memory_gib) and self.kv_memory_gib > 0, "cache.kv_memory_gib", "a number > 0",
                self.kv_memory_gib)
        utilization = self.gpu_memory_utilization
        require(utilization is None or (is_number(utilization) and 0 < utilization <= 1),
                "cache.gpu_memory_utilization", "a number in (0, 1] or null", utilization)
        require(self.num_blocks is None or self.num_blocks >= 1, "cache.num_blocks", "an integer >= 1 or null",
                self.num_blocks)
        require(is_number(self.watermark) and 0 <= self.watermark < 1, "cache.watermark", "a number in [0, 1)",
                self.watermark)


@dataclass
class SchedulerConfig:
    policy: str = "sarathi"  # vllm | orca | faster_transformer | sarathi | chunked_prefill | hybrid
    chunk_size: int = 512  # token budget per iteration (sarathi, chunked_prefill)
    max_num_seqs: int = 128  # requests in a batch at most
    max_num_batched_tokens: int = 4096  # token budget of the vllm policy

    def __post_init__(self) -> None:
        for key in ("chunk_size", "max_num_seqs", "max_num_batched_tokens"):
            require(getattr(self, key) >= 1, f"scheduler.{key}", "an integer >= 1", getattr(self, key))


@dataclass
class ParallelConfig:
    """How many processes run the model (engine/distributed/; vLLM's names). 1 and 1: one process."""

    tensor_parallel_size: int = 1  # ranks that split each layer by attention heads and MLP columns
    pipeline_parallel_size: int = 1  # ranks that each run a contiguous stage of layers
    startup_timeout_s: float = 120.0  # for every rank to join (the error names the ranks that did not)
    # prefill and decode on instances of their own (engine/distributed/remote_prefill.py): 1p1d; None: colocated
    disaggregation: str | None = None
    data_parallel_size: int = 1  # whole engines, each in a process, behind a router (engine/distributed/replicas.py)
    router: str = "least_outstanding"  # which replica takes a request: least_outstanding | round_robin

    def __post_init__(self) -> None:
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            require(getattr(self, key) >= 1, f"parallel.{key}", "an integer >= 1", getattr(self, key))
        require(is_number(self.startup_timeout_s) and self.startup_timeout_s > 0, "parallel.startup_timeout_s",
                "a number > 0", self.startup_timeout_s)
        require(self.disaggregation in DISAGGREGATIONS, "parallel.disaggregation", "1p1d or null",
                self.disaggregation)
        require(self.data_parallel_size >= 1, "parallel.data_parallel_size", "an integer >= 1",
                self.data_parallel_size)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.parallel.disaggregation is not None:
            self._check_disaggregation()
        if self.parallel.data_parallel_size > 1:
            self._check_replicas()

    def _check_replicas(self) -> None:
        """The other keys data-parallel replicas (engine/distributed/replicas.py) need."""
        keys = f"parallel.data_parallel_size={self.parallel.data_parallel_size}"
        if self.parallel.world_size > 1 or self.parallel.disaggregation is not None:
            raise ConfigError(f"{keys} runs each replica as one process: set parallel.tensor_parallel_size and "
                              "parallel.pipeline_parallel_size to 1 and parallel.disaggregation to null")
        if self.model.runner != "model" or self.model.deployment is not None:
            raise ConfigError(f"{keys} needs model.runner=model (a real model, no simulated deployment)")

    def _check_disaggregation(self) -> None:
        """The other sections' keys a disaggregated deployment (engine/distributed/remote_prefill.py) needs."""
        keys = f"parallel.disaggregation={self.parallel.disaggregation}"
        if self.parallel.world_size > 1:
            raise ConfigError(f"{keys} runs each instance in one process: set parallel.tensor_parallel_size and "
                              "parallel.pipeline_parallel_size to 1")
        if self.model.runner != "model" or self.model.deployment is not None:
            raise ConfigError(f"{keys} needs model.runner=model (a real model, no simulated deployment)")
        if not self.cache.enable_prefix_caching:
            raise ConfigError(f"{keys} moves each prompt's KV through the prefix cache: set "
                              "cache.enable_prefix_caching=true")

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """Build from flat knobs (``model=``, ``scheduler=``, ``chunk_size=``, ...), vLLM style."""
        sections = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
                    "parallel": ParallelConfig}
        aliases = {"scheduler": "policy"}
        knobs: dict[str, dict] = {section: {} for section in sections}
        for key, value in kwargs.items():
            name = aliases.get(key, key)
            section = next((s for s, c in sections.items() if name in {f.name for f in fields(c)}), None)
            if section is None:
                raise ValueError(f"unknown engine option {key!r}")
            knobs[section][name] = value
        return cls(**{section: c(**knobs[section]) for section, c in sections.items()})

    def engine_sections(self) -> EngineConfig:
        """The engine's own sections: a command's config (loadgen's BenchConfig) extends EngineConfig with
        settings of its own, and builds the engine of these."""
        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(EngineConfig)})
