"""A worker rank's process: join the group, build its shard, then run every iteration the driver sends."""
from __future__ import annotations

import os
import pickle
import signal
import threading
from multiprocessing.connection import Connection

from stallfree.engine.distributed.channel import Channel
from stallfree.engine.distributed.groups import make_groups
from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.distributed.mailbox import Mailbox
from stallfree.engine.distributed.rank_runner import backend_for, build_rank_runner, rank_device, use_cores
from stallfree.engine.distributed.rendezvous import SETUP_KEY, Rendezvous, init_process_group
from stallfree.engine.distributed.stage_worker import serve_stage
from stallfree.engine.runner.factory import RunnerSetup


def run_worker(rank: int, rendezvous: Rendezvous, layout: RankLayout, pipe: Connection) -> None:
    """The process target of a worker (engine/distributed/workers.py). Ctrl-C reaches every process of the
    terminal's process group: the workers ignore it and leave when the driver closes their pipe (or dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_when_closed, args=(pipe,), daemon=True, name="driver-pipe").start()
    try:
        serve(rank, rendezvous, layout)
    except BaseException as exc:
        pipe.send(f"{type(exc).__name__}: {exc}")
        os._exit(1)  # not sys.exit: a process group's threads may hold the interpreter's exit
    os._exit(0)


def _exit_when_closed(pipe: Connection) -> None:
    try:
        pipe.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


def serve(rank: int, rendezvous: Rendezvous, layout: RankLayout) -> None:
    local_ranks = rendezvous.local_ranks(layout)
    store = rendezvous.store(layout.world_size, is_master=False)
    setup: RunnerSetup = pickle.loads(store.get(SETUP_KEY))
    device = rank_device(setup.device, rank - local_ranks.start)
    if device.type == "cpu":
        use_cores(len(local_ranks))
    init_process_group(store, rank, layout.world_size, backend_for(device), rendezvous.timeout_s)
    groups = make_groups(layout, rank)
    runner = build_rank_runner(setup, layout, rank, groups, device)
    channel = Channel(groups.control)
    channel.min_over_ranks(runner.num_blocks)
    if layout.pipeline_parallel_size > 1:
        serve_stage(runner, layout, rank, Mailbox(store, rank), setup.arch.hidden_size)
        return
    while (batch := channel.receive_batch()) is not None:
        runner.execute_forward(batch)
