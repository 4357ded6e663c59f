"""The driver: rank 0, in the engine's process. It starts the workers of its node, joins the group, runs its
own shard and samples, and hands each iteration to the workers first."""
from __future__ import annotations

import dataclasses
import logging
import pickle
import weakref
from collections.abc import Callable

from stallfree.engine.distributed.channel import DRIVER, Channel
from stallfree.engine.distributed.groups import make_groups
from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.distributed.mailbox import Mailbox
from stallfree.engine.distributed.pipeline_runner import PipelineRunner
from stallfree.engine.distributed.rank_runner import backend_for, build_rank_runner, rank_device, use_cores
from stallfree.engine.distributed.rendezvous import SETUP_KEY, Rendezvous, init_process_group, wait_for_ranks
from stallfree.engine.distributed.stage_worker import stage_link
from stallfree.engine.distributed.teardown import DEATH_GRACE_S, GroupState, is_collective_failure, stop_ranks
from stallfree.engine.distributed.validation import check_parallel
from stallfree.engine.distributed.worker import run_worker
from stallfree.engine.distributed.workers import LocalWorkers, WorkerDied
from stallfree.engine.runner.base import BatchRunner
from stallfree.engine.runner.clock import WallClock
from stallfree.engine.runner.factory import RunnerSetup
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.runner.serial import SerialRunner
from stallfree.engine.scheduler.output import SchedulerOutput

log = logging.getLogger(__name__)
class DistributedRunner:
    """The Runner the engine steps: the driver's ModelRunner, with every iteration broadcast to the workers."""

    reads_block_tables = True
    computes_logits = True

    def __init__(self, local: ModelRunner, channel: Channel, workers: LocalWorkers, num_blocks: int):
        self.local, self.channel, self.workers = local, channel, workers
        self.num_blocks = num_blocks  # the fewest any rank holds
        self.group = GroupState()
        self._finalizer = weakref.finalize(self, stop_ranks, workers, channel, self.group)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        try:
            self.workers.check()
            self.group.between_steps = False
            self.channel.send_batch(scheduler_output)
            output = self.local.execute_model(scheduler_output)
            self.group.between_steps = True
            return output
        except WorkerDied:
            self.shutdown()
            raise
        except Exception as exc:
            if not is_collective_failure(exc):
                raise  # the driver's own failure: the engine re-runs the iteration without the failing requests
            death = self.workers.wait_for_death(DEATH_GRACE_S) or f"a collective failed: {exc}"
            self.shutdown()  # the group is broken either way
            raise WorkerDied(death) from exc

    def shutdown(self) -> None:
        """Stop every worker and leave the process group (again: a no-op)."""
        self._finalizer()


def start_driver(setup: RunnerSetup, worker_target: Callable[..., None] | None = None
                 ) -> tuple[DistributedRunner | PipelineRunner, BatchRunner, WallClock]:
    """Check the sizes, start this node's workers (``worker_target``: tests stand in a rank that never joins)
    and build rank 0's runner; on any failure every worker is stopped before the error propagates. The runner,
    the BatchRunner the engine steps (a pipeline's runner is one itself) and the clock."""
    parallel = setup.config.parallel
    layout = RankLayout(parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
    rendezvous = Rendezvous.from_env(parallel.startup_timeout_s)
    local_ranks = rendezvous.local_ranks(layout)
    check_parallel(parallel, setup.arch, setup.device, len(local_ranks), setup.config.model.runner)
    if rendezvous.node_rank != 0:
        raise ValueError(f"NODE_RANK={rendezvous.node_rank}: the engine runs on node 0; other nodes run "
                         "python -m stallfree.engine.distributed.node")
    store = rendezvous.store(layout.world_size, is_master=True)
    rendezvous = dataclasses.replace(rendezvous, master_port=store.port)
    store.set(SETUP_KEY, pickle.dumps(setup))
    workers = LocalWorkers.spawn(local_ranks[1:], worker_target or run_worker, (rendezvous, layout))
    try:
        wait_for_ranks(store, layout.world_size, rendezvous.timeout_s, workers.check)
        device = rank_device(setup.device, 0)
        if device.type == "cpu":
            use_cores(len(local_ranks))
        init_process_group(store, 0, layout.world_size, backend_for(device), rendezvous.timeout_s)
        groups = make_groups(layout, 0)
        local = build_rank_runner(setup, layout, 0, groups, device)
        channel = Channel(groups.control)
        num_blocks = channel.min_over_ranks(local.num_blocks)
    except BaseException as exc:
        broke = isinstance(exc, Exception) and is_collective_failure(exc)
        death = workers.wait_for_death(DEATH_GRACE_S) if broke else workers.first_death()
        stop_ranks(workers)
        if death is not None:
            raise WorkerDied(f"startup failed: {death}") from exc
        raise
    log.info("%d ranks: tensor_parallel_size=%d x pipeline_parallel_size=%d, %s, %d KV blocks per rank",
             layout.world_size, layout.tensor_parallel_size, layout.pipeline_parallel_size,
             backend_for(device), num_blocks)
    clock = WallClock()
    if layout.pipeline_parallel_size > 1:
        pipeline = PipelineRunner(local, layout, Mailbox(store, DRIVER), stage_link(layout, 0, local,
                                                                                    setup.arch.hidden_size),
                                  workers, num_blocks)
        return pipeline, pipeline, clock
    runner = DistributedRunner(local, channel, workers, num_blocks)
    return runner, SerialRunner(runner, clock), clock
