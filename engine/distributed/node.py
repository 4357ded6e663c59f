"""``python -m stallfree.engine.distributed.node``: the worker ranks of a node other than the driver's.

Run it on every node with NODE_RANK >= 1, with the driver node's MASTER_ADDR and MASTER_PORT, the same NNODES,
and the model at the same path; it reads the engine's setup from the driver's store, starts this node's
ranks and exits when they end (non-zero if one failed). Ctrl-C or SIGTERM stops them.
"""
from __future__ import annotations

import pickle
import signal
import sys
from multiprocessing.connection import wait

from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.distributed.rendezvous import SETUP_KEY, Rendezvous
from stallfree.engine.distributed.worker import run_worker
from stallfree.engine.distributed.workers import LocalWorkers

DEFAULT_TIMEOUT_S = 600.0  # for the driver's store to come up and hand out the setup


def main() -> int:
    rendezvous = Rendezvous.from_env(DEFAULT_TIMEOUT_S)
    if rendezvous.node_rank == 0:
        print("stallfree node: NODE_RANK=0 is the driver's node (it runs the engine)", file=sys.stderr)
        return 2
    setup = pickle.loads(rendezvous.store(None, is_master=False).get(SETUP_KEY))
    parallel = setup.config.parallel
    layout = RankLayout(parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
    rendezvous = Rendezvous(rendezvous.master_addr, rendezvous.master_port, rendezvous.nnodes,
                            rendezvous.node_rank, parallel.startup_timeout_s)
    workers = LocalWorkers.spawn(rendezvous.local_ranks(layout), run_worker, (rendezvous, layout))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: workers.stop())
    while alive := [w.process.sentinel for w in workers.workers if w.process.is_alive()]:
        wait(alive)
    failed = [w.describe_death() for w in workers.workers if w.process.exitcode]
    for death in failed:
        print(f"stallfree node: {death}", file=sys.stderr)
    workers.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
