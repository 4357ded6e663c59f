"""One rank's model runner: its device, its threads and its shard of the model, on either side of the pipe."""
from __future__ import annotations

import dataclasses
import os

import torch

from stallfree.engine.distributed.groups import RankGroups
from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.model.stages import PipelineStage
from stallfree.engine.model.tensor_parallel import TensorParallel
from stallfree.engine.runner.factory import RunnerSetup, build_model_runner
from stallfree.engine.runner.model_runner import ModelRunner


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """One GPU per rank of a node; every rank on the CPU."""
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def use_cores(ranks_here: int) -> None:
    """A CPU rank's threads: an even share of this node's cores (the ranks run at once)."""
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ranks_here))


def build_rank_runner(setup: RunnerSetup, layout: RankLayout, rank: int, groups: RankGroups,
                      device: torch.device) -> ModelRunner:
    tp = None if layout.tensor_parallel_size == 1 else TensorParallel(
        layout.tp_rank(rank), layout.tensor_parallel_size, groups.tp)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    stage = None if layout.pipeline_parallel_size == 1 else PipelineStage.of(
        setup.arch.num_layers, layout.pp_rank(rank), layout.pipeline_parallel_size)
    return build_model_runner(dataclasses.replace(setup, device=device, tensor_parallel=tp, pipeline_stage=stage))
