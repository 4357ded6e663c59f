"""Where the ranks meet: the TCP store on MASTER_ADDR:MASTER_PORT, the startup deadline that names the ranks
that never joined, and ``torch.distributed.init_process_group`` on that store.

Environment (the names torchrun and most launchers use): MASTER_ADDR (default 127.0.0.1), MASTER_PORT
(default: a free port, single node only), NNODES (default 1) and NODE_RANK (default 0). Node 0 runs the
engine; every other node runs ``python -m stallfree.engine.distributed.node`` with the same variables.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from stallfree.engine.distributed.layout import RankLayout

SETUP_KEY = "stallfree/setup"  # the pickled RunnerSetup every rank builds its runner from
POLL_S = 0.05


class StartupTimeout(RuntimeError):
    """A rank did not join within the startup timeout."""


@dataclass(frozen=True)
class Rendezvous:
    master_addr: str
    master_port: int  # 0 on the driver of a single node: the store picks a free port
    nnodes: int
    node_rank: int
    timeout_s: float

    @classmethod
    def from_env(cls, timeout_s: float) -> Rendezvous:
        nnodes, node_rank = int(os.environ.get("NNODES", "1")), int(os.environ.get("NODE_RANK", "0"))
        port = os.environ.get("MASTER_PORT")
        if port is None and nnodes > 1:
            raise ValueError("NNODES > 1 needs MASTER_ADDR and MASTER_PORT (the driver node's address)")
        return cls(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(port or 0), nnodes, node_rank, timeout_s)

    def local_ranks(self, layout: RankLayout) -> range:
        """The global ranks that run on this node."""
        if layout.world_size % self.nnodes:
            raise ValueError(f"NNODES={self.nnodes} does not divide the {layout.world_size} ranks")
        per_node = layout.world_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    def store(self, world_size: int | None, is_master: bool) -> dist.TCPStore:
        """The driver's store (``is_master``: it serves it), or a client of it."""
        return dist.TCPStore(self.master_addr, self.master_port, world_size, is_master=is_master,
                             timeout=timedelta(seconds=self.timeout_s), wait_for_workers=False)


def joined_key(rank: int) -> str:
    return f"stallfree/joined/{rank}"


def wait_for_ranks(store: dist.TCPStore, world_size: int, timeout_s: float,
                   check_workers: Callable[[], None]) -> None:
    """Return once every other rank has announced itself on ``store``; ``check_workers`` raises if a local
    worker died meanwhile. Raises StartupTimeout naming the ranks still missing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while missing := [r for r in range(1, world_size) if not store.check([joined_key(r)])]:
        check_workers()
        if time.monotonic() > deadline:
            raise StartupTimeout(f"rank {', '.join(map(str, missing))} of {world_size} did not join the process "
                                 f"group within {timeout_s:g} s (store {store.host}:{store.port})")
        time.sleep(POLL_S)


def init_process_group(store: dist.TCPStore, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    """Announce ``rank`` on the store, then join the default process group."""
    store.set(joined_key(rank), "1")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
