"""Ranks laid out as a tensor-parallel x pipeline-parallel grid: the ranks of a pipeline stage are contiguous."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankLayout:
    tensor_parallel_size: int
    pipeline_parallel_size: int

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def tp_rank(self, rank: int) -> int:
        """The rank's place in its tensor-parallel group (the shard of each layer it holds)."""
        return rank % self.tensor_parallel_size

    def pp_rank(self, rank: int) -> int:
        """The pipeline stage the rank belongs to."""
        return rank // self.tensor_parallel_size

    def tp_groups(self) -> list[list[int]]:
        """The ranks of each pipeline stage, which all-reduce together."""
        tp = self.tensor_parallel_size
        return [list(range(stage * tp, (stage + 1) * tp)) for stage in range(self.pipeline_parallel_size)]

    def pp_groups(self) -> list[list[int]]:
        """The ranks holding the same shard in every stage, which pass hidden states along the pipeline."""
        tp = self.tensor_parallel_size
        return [list(range(shard, self.world_size, tp)) for shard in range(tp)]
