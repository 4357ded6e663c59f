"""Messages between the driver and a pipeline's stage workers through the rendezvous store (torch's TCPStore):
the micro-batch tickets the driver posts to every worker, and the result the last stage posts back.

Why the store and not torch.distributed: the driver must see whether a result is back without blocking (it
keeps scheduling while micro-batches are in flight), and a gloo receive can neither be polled (its
``is_completed`` stays false until ``wait``) nor wait longer than the process group's timeout, which an idle
server outlasts. The store's ``check`` polls and its ``wait`` may wait for good. The hidden states, the bulk
of the traffic, go between stages over torch.distributed (engine/distributed/stage_link.py).
"""
from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

POLL_S = 0.0002  # between checks while the driver waits for a result (it checks for dead workers meanwhile)
FOREVER = timedelta(days=365)  # a worker waits this long for its next micro-batch: as long as the server idles


def key(rank: int, seq: int) -> str:
    return f"stallfree/pipeline/{rank}/{seq}"


class Mailbox:
    """``rank``'s mailbox: messages numbered by micro-batch, each read once."""

    def __init__(self, store: dist.Store, rank: int):
        self.store, self.rank = store, rank

    def post(self, rank: int, seq: int, message: Any) -> None:
        self.store.set(key(rank, seq), pickle.dumps(message))

    def has(self, seq: int) -> bool:
        return self.store.check([key(self.rank, seq)])

    def wait(self, seq: int, check: Callable[[], None]) -> None:
        """Until message ``seq`` is here, calling ``check`` between polls (it raises to stop waiting)."""
        while not self.has(seq):
            check()
            time.sleep(POLL_S)

    def take(self, seq: int) -> Any:
        """Message ``seq``, waiting for it as long as it takes."""
        name = key(self.rank, seq)
        self.store.wait([name], FOREVER)
        message = pickle.loads(self.store.get(name))
        self.store.delete_key(name)
        return message
