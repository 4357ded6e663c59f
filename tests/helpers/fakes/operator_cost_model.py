"""FakeOperatorCostModel: a stand-in for engine.simulator.ops.OperatorCostModel (same interface) with round,
linear operator times, for tests of what uses the cost model (pipeline stages, runner, engine), not of the
cost model itself. Also a fake model shape and GPU, and ``fake_resolved`` to put them behind a Deployment."""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.simulator.deployment import Resolved

LAYER_FIXED_S = 1e-3  # per layer and micro-batch
LAYER_PER_TOKEN_S = 1e-5  # per layer and token
EMBEDDING_S = 2e-3  # the first stage
LM_HEAD_S = 3e-3  # the last stage
CPU_OVERHEAD_S = 4e-3  # per iteration
SEND_PER_TOKEN_S = 1e-6  # PP send, per token


@dataclass(frozen=True)
class FakeShape:
    name: str = "fake-1b"
    num_layers: int = 8
    hidden_size: int = 1024
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 4096
    vocab_size: int = 1000
    gated_mlp: bool = True
    parallel_attn_mlp: bool = False

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return 2 * 2**30  # 2 GiB, round for hand-computed memory plans

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class FakeGPU:
    name: str = "fake-gpu"
    peak_tflops_bf16: float = 100.0
    mem_bandwidth_gbps: float = 1000.0
    memory_gib: float = 10.0


@dataclass(frozen=True)
class FakeStageBatch:
    prefill_chunks: tuple[tuple[int, int], ...]
    decode_contexts: tuple[int, ...]

    @classmethod
    def of(cls, scheduler_output) -> FakeStageBatch:
        units = scheduler_output.units
        return cls(tuple((u.num_new_tokens, u.num_computed_tokens) for u in units if u.is_prefill),
                   tuple(u.num_computed_tokens + 1 for u in units if not u.is_prefill))

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks) + len(self.decode_contexts)


class FakeOperatorCostModel:
    def __init__(self):
        self.stage_calls: list[tuple[int, int, bool, bool]] = []  # (tokens, layers, first, last)

    def layer_seconds(self, batch: FakeStageBatch) -> dict[str, float]:
        return {"fixed": LAYER_FIXED_S, "linear": LAYER_PER_TOKEN_S * batch.num_tokens}

    def stage_seconds(self, batch: FakeStageBatch, num_layers: int, *, first: bool, last: bool) -> float:
        self.stage_calls.append((batch.num_tokens, num_layers, first, last))
        return (num_layers * sum(self.layer_seconds(batch).values()) + (EMBEDDING_S if first else 0.0)
                + (LM_HEAD_S if last else 0.0))

    def pp_send_seconds(self, num_tokens: int) -> float:
        return SEND_PER_TOKEN_S * num_tokens

    def cpu_overhead_seconds(self, batch: FakeStageBatch) -> float:
        return CPU_OVERHEAD_S

    def describe(self) -> dict:
        return {"fake": True}


def fake_resolved(shape: FakeShape | None = None, gpu: FakeGPU | None = None) -> Resolved:
    return Resolved(shape or FakeShape(), gpu or FakeGPU(), FakeOperatorCostModel(), FakeStageBatch.of)
