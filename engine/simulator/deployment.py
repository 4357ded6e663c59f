"""A deployment: a model shape on a GPU type, with tensor (TP) and pipeline (PP) parallelism, an interconnect
and the memory and batch limits that size its KV cache. The ``deployment`` block of a ``conf/model`` preset."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from stallfree.engine.config_checks import ConfigError, is_int, is_number, require
from stallfree.engine.model.stages import stage_layer_counts

KEY = "model.deployment"


class Resolved(NamedTuple):
    """What a deployment's names stand for: its model shape, its GPU and its operator cost model."""

    shape: Any  # engine.simulator.shapes.ModelShape
    gpu: Any  # engine.simulator.hardware.GPUSpec
    cost_model: Any  # engine.simulator.ops.OperatorCostModel
    stage_batch_of: Any  # engine.simulator.ops.StageBatch.of: SchedulerOutput -> StageBatch


@dataclass(frozen=True)
class Deployment:
    gpu: str  # a key of engine.simulator.hardware.GPUS: a100, a40, h100, h200
    shape: str  # a key of engine.simulator.shapes.SHAPES: mistral-7b, yi-34b, llama2-70b, falcon-180b, ...
    tp: int = 1  # tensor-parallel degree: GPUs per pipeline stage
    pp: int = 1  # pipeline-parallel degree: stages, each a contiguous run of layers
    interconnect: str = "nvlink"  # nvlink (A100/H100/H200 pairs, DGX) | pcie (A40)
    gpu_memory_utilization: float = 0.9  # fraction of each GPU's memory the engine may use (vLLM's default)
    activation_reserve_gib: float | None = None  # per GPU, for activations; None: engine.simulator.memory_plan estimates it
    max_batch_size: int = 128  # requests in one batch at most (vLLM's max_num_seqs; the paper also uses 32, 64)
    dtype_bytes: int = 2  # bf16/fp16 weights and KV cache
    # micro-batches in flight at most; None: one per stage (PP). 1: one iteration at a time (the studies)
    max_in_flight: int | None = None

    @classmethod
    def from_config(cls, values: Mapping) -> Deployment:
        """From a ``deployment`` block; raises ConfigError naming the first bad key."""
        require(isinstance(values, Mapping), KEY, "a mapping of deployment settings", values)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{KEY}.{unknown[0]} is not a deployment setting (known: {', '.join(sorted(known))})")
        for key in ("gpu", "shape"):
            require(isinstance(values.get(key), str) and bool(values.get(key)), f"{KEY}.{key}", "a non-empty string",
                    values.get(key))
        for key in ("tp", "pp", "max_batch_size", "dtype_bytes"):
            value = values.get(key, 1)
            require(is_int(value) and value >= 1, f"{KEY}.{key}", "an integer >= 1", value)
        util = values.get("gpu_memory_utilization", 0.9)
        require(is_number(util) and 0 < util <= 1, f"{KEY}.gpu_memory_utilization", "a number in (0, 1]", util)
        in_flight = values.get("max_in_flight")
        require(in_flight is None or (is_int(in_flight) and in_flight >= 1), f"{KEY}.max_in_flight",
                "an integer >= 1 or null", in_flight)
        reserve = values.get("activation_reserve_gib")
        require(reserve is None or (is_number(reserve) and reserve >= 0), f"{KEY}.activation_reserve_gib",
                "a number >= 0 or null", reserve)
        require(isinstance(values.get("interconnect", "nvlink"), str), f"{KEY}.interconnect", "a string",
                values.get("interconnect"))
        return cls(**values)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers per pipeline stage: as even as possible, the earlier stages taking the remainder."""
        if num_layers < self.pp:
            raise ConfigError(f"{KEY}.pp must be at most the model's {num_layers} layers, got {self.pp}")
        return stage_layer_counts(num_layers, self.pp)

    def resolve(self) -> Resolved:
        """The shape, GPU and operator cost model these names stand for (ConfigError naming an unknown one)."""
        from stallfree.engine.simulator.hardware import GPUS
        from stallfree.engine.simulator.ops import OperatorCostModel, StageBatch
        from stallfree.engine.simulator.shapes import SHAPES

        require(self.gpu in GPUS, f"{KEY}.gpu", f"one of {sorted(GPUS)}", self.gpu)
        require(self.shape in SHAPES, f"{KEY}.shape", f"one of {sorted(SHAPES)}", self.shape)
        shape = SHAPES[self.shape]
        try:
            cost_model = OperatorCostModel.build(self.gpu, shape, self.tp, self.interconnect)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"{KEY}: no operator cost model for {self}: {e}") from None
        return Resolved(shape, GPUS[self.gpu], cost_model, StageBatch.of)
