"""Stopping the ranks: what a failed collective looks like, how long a worker that broke one has to be seen
gone, and the stop of every rank (the driver's runners, one process or a pipeline, share it)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.distributed as dist

from stallfree.engine.distributed.channel import Channel
from stallfree.engine.distributed.workers import LocalWorkers

log = logging.getLogger(__name__)
# After a failed collective, how long the worker that broke it has to be seen gone: a killed process closes
# its sockets before it can be reaped, and a loaded machine takes seconds over that.
DEATH_GRACE_S = 10.0


def is_collective_failure(exc: Exception) -> bool:
    """A torch.distributed operation failed (gloo raises plain RuntimeErrors that name its sources)."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo" in str(exc))


@dataclass
class GroupState:
    # Every rank waits for the next broadcast (no step was cut short): a stop message reaches them all.
    between_steps: bool = True


def stop_ranks(workers: LocalWorkers, channel: Channel | None = None, group: GroupState | None = None) -> None:
    """Tell the ranks to stop where the group is sound (those of other nodes learn it only so; this node's
    also leave when their pipes close), then stop this node's workers and leave the group."""
    if channel is not None and group is not None and group.between_steps and workers.first_death() is None:
        try:
            channel.send_batch(None)
        except Exception as exc:  # a rank gone meanwhile: the pipes and the group's end stop the others
            log.warning("the stop message did not reach every rank: %s", exc)
    workers.stop()
    if dist.is_initialized():
        dist.destroy_process_group()
