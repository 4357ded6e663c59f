"""The process groups of a rank: its tensor-parallel group, its pipeline group and a gloo control group over
all ranks (objects travel on CPU even when the tensors are on GPUs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from stallfree.engine.distributed.layout import RankLayout


@dataclass(frozen=True)
class RankGroups:
    tp: Any  # torch.distributed.ProcessGroup of this rank's stage
    pp: Any  # of the ranks holding this rank's shard in every stage
    control: Any  # gloo, all ranks: SchedulerOutputs, runner outputs, agreement on the KV block count


def make_groups(layout: RankLayout, rank: int) -> RankGroups:
    """Every rank creates every group, in the same order (torch.distributed's rule), and keeps its own."""
    tp = [(ranks, dist.new_group(ranks)) for ranks in layout.tp_groups()]
    pp = [(ranks, dist.new_group(ranks)) for ranks in layout.pp_groups()]
    control = dist.new_group(list(range(layout.world_size)), backend="gloo")
    return RankGroups(next(g for r, g in tp if rank in r), next(g for r, g in pp if rank in r), control)
