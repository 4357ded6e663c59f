"""Messages between the driver and a pipeline's stage workers through the rendezvous store (torch's TCPStore):
the micro-batch tickets the driver posts to every worker, and the result the last stage posts back. Each rank's
mailbox is a queue on the store, read in the order posted: a message costs one round trip to post and one to
take.

Why the store and not torch.distributed: the driver must see whether a result is back without blocking (it
keeps scheduling while micro-batches are in flight), and a gloo receive can neither be polled (its
``is_completed`` stays false until ``wait``) nor wait longer than the process group's timeout, which an idle
server outlasts. The store's queue can be polled, and a blocking pop may wait for good. The hidden states, the
bulk of the traffic, go between stages over torch.distributed (engine/distributed/stage_link.py).
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


def key(rank: int) -> str:
    return f"stallfree/pipeline/{rank}"


class Mailbox:
    """``rank``'s mailbox: messages taken once, in the order they were posted."""

    def __init__(self, store: dist.Store, rank: int):
        # its own connection, whose blocking take waits for good, apart from the rendezvous' timeout
        self.store, self.rank = store.clone(), rank
        self.store.set_timeout(FOREVER)

    def post(self, rank: int, message: Any) -> None:
        self.store.queue_push(key(rank), pickle.dumps(message))

    def has(self) -> bool:
        return self.store.queue_len(key(self.rank)) > 0

    def wait(self, check: Callable[[], None]) -> None:
        """Until a message is here, calling ``check`` between polls (it raises to stop waiting)."""
        while not self.has():
            check()
            time.sleep(POLL_S)

    def take(self) -> Any:
        """The oldest message, waiting for it as long as it takes."""
        return pickle.loads(self.store.queue_pop(key(self.rank)))
