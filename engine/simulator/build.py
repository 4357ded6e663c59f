"""From an engine config with a ``model.deployment`` block to what LLMEngine needs before its runner is built
(engine/executor.py): the deployment resolved, the architecture the engine checks requests against (from the
model shape: no checkpoint, no tokenizer) and the KV blocks of the memory plan."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stallfree.engine.config import EngineConfig
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.simulator.deployment import Deployment, Resolved
from stallfree.engine.simulator.memory_plan import MemoryPlan, plan_memory

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class Simulation:
    deployment: Deployment
    resolved: Resolved
    arch: ArchConfig
    memory: MemoryPlan


def arch_from_shape(shape, max_model_len: int) -> ArchConfig:
    return ArchConfig(architecture=f"simulated:{shape.name}", vocab_size=shape.vocab_size,
                      hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                      num_layers=shape.num_layers, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                      head_dim=shape.head_dim, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                      qkv_bias=False, tie_word_embeddings=False, max_position_embeddings=max_model_len,
                      sliding_window=None, eos_token_ids=[])


def build_simulation(config: EngineConfig) -> Simulation:
    mc = config.model
    if mc.runner != "simulated" or mc.clock != "virtual":
        raise ConfigError(f"model.deployment needs model.runner=simulated and model.clock=virtual, got "
                          f"{mc.runner!r} and {mc.clock!r}")
    deployment = Deployment.from_config(mc.deployment)
    resolved = deployment.resolve()
    arch = arch_from_shape(resolved.shape, mc.max_model_len or DEFAULT_MAX_MODEL_LEN)
    memory = plan_memory(deployment, resolved.shape, resolved.gpu, config.cache.block_size)
    return Simulation(deployment, resolved, arch, memory)


def bounded_by_deployment(config: EngineConfig, simulation: Simulation) -> EngineConfig:
    """``config`` with ``scheduler.max_num_seqs`` at most the deployment's batch size."""
    batch_limit = min(config.scheduler.max_num_seqs, simulation.deployment.max_batch_size)
    return dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, max_num_seqs=batch_limit))
