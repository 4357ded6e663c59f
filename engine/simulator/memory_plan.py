"""The memory planner: how many KV-cache blocks a deployment holds, as vLLM sizes its cache.

Per GPU: usable memory = GPU memory x ``gpu_memory_utilization``; the weights take their share
(weights / (TP x PP)); an activation reserve is kept for the forward pass; the rest holds KV cache. A
KV block (``block_size`` tokens of every layer) is spread over the GPUs: each pipeline stage holds its
layers' K and V, and each GPU of a stage its share of the KV heads (a KV head is replicated when TP
exceeds the KV heads). The block count is what the most loaded GPU (the stage with the most layers) can
hold: the number of blocks the real KVCacheManager then manages.
"""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.simulator.deployment import KEY, Deployment

GIB = 2**30
# vLLM sizes the activation reserve by profiling one forward pass of its largest batch; this estimate
# stands in for that profile: PROFILE_TOKENS tokens through one layer's widest activations (the MLP's
# up/gate output, the residual stream and the attention's Q/K/V), fp32 logits of MAX_LOGIT_ROWS rows on
# the last stage, plus CONTEXT_GIB of CUDA context, NCCL buffers and allocator slack.
PROFILE_TOKENS = 4096
MAX_LOGIT_ROWS = 256
CONTEXT_GIB = 1.0


@dataclass(frozen=True)
class MemoryPlan:
    gpu_memory_gib: float
    usable_gib: float  # gpu_memory_gib x gpu_memory_utilization
    weights_gib: float  # per GPU
    activation_reserve_gib: float  # per GPU
    kv_cache_gib: float  # per GPU
    kv_bytes_per_block: int  # on the most loaded GPU
    num_blocks: int


def activation_reserve_gib(deployment: Deployment, shape) -> float:
    """The estimated activation memory per GPU (see PROFILE_TOKENS) when the deployment sets none."""
    if deployment.activation_reserve_gib is not None:
        return float(deployment.activation_reserve_gib)
    widest = (3 if shape.gated_mlp else 2) * shape.intermediate_size // deployment.tp
    per_token = widest + 2 * shape.hidden_size + (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim // deployment.tp
    logits = MAX_LOGIT_ROWS * shape.vocab_size // deployment.tp * 4
    return (PROFILE_TOKENS * per_token * deployment.dtype_bytes + logits) / GIB + CONTEXT_GIB


def kv_bytes_per_block(deployment: Deployment, shape, block_size: int) -> int:
    """Bytes of one KV block on the GPU with the most layers."""
    layers = max(deployment.stage_layers(shape.num_layers))
    kv_heads = max(1, shape.num_kv_heads // deployment.tp)
    return 2 * layers * kv_heads * shape.head_dim * block_size * deployment.dtype_bytes


def plan_memory(deployment: Deployment, shape, gpu, block_size: int) -> MemoryPlan:
    """The deployment's KV-cache size; ConfigError when its weights and reserve leave no room for one block."""
    usable = gpu.memory_gib * deployment.gpu_memory_utilization
    weights = shape.weight_bytes(deployment.dtype_bytes) / deployment.num_gpus / GIB
    reserve = activation_reserve_gib(deployment, shape)
    kv_gib = usable - weights - reserve
    per_block = kv_bytes_per_block(deployment, shape, block_size)
    num_blocks = int(kv_gib * GIB // per_block) if kv_gib > 0 else 0
    if num_blocks < 1:
        raise ConfigError(f"{KEY}: {shape.name} does not fit on {deployment.num_gpus} x {gpu.name} at TP{deployment.tp}"
                          f"-PP{deployment.pp}: per GPU {weights:.1f} GiB of weights + {reserve:.1f} GiB reserve "
                          f"> {usable:.1f} GiB usable")
    return MemoryPlan(gpu.memory_gib, usable, weights, reserve, kv_gib, per_block, num_blocks)
