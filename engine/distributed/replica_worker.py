"""One data-parallel replica (``parallel.data_parallel_size``): a whole engine in a process of its own, serving the
requests the router sends it and sending back each step's outputs.

Messages in, on the pipe: ``("add", request_id, token_ids, params, arrival_time)``, ``("abort", request_id)``,
``("reset", None)`` (its prefix cache). Out: ``("ready", ReplicaLimits)``; ``("outputs", outputs, records,
ReplicaLoad)`` after each step that produced either; ``("died", error)``. The pipe closing stops it."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from stallfree.engine.distributed.instance import run_instance
from stallfree.engine.distributed.rank_runner import use_cores
from stallfree.engine.outputs import RequestOutput
from stallfree.engine.request import RequestMetrics


@dataclass(frozen=True)
class ReplicaLimits:
    """What the front end checks a request against before it routes it (as the replica would)."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    watermark_blocks: int
    dtype_choice: Any
    linear_kernels: str | None


@dataclass(frozen=True)
class ReplicaLoad:
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0


def refused(request_id: str, token_ids: list[int], arrival_time: float, error: str) -> RequestOutput:
    """The final output of a request the replica would not take."""
    return RequestOutput(request_id, token_ids, [], [], "", True, "error", RequestMetrics(arrival_time),
                         error=f"the replica refused it: {error}")


def serve_replica(rank: int, num_replicas: int, config: Any, build_engine: Callable[[Any], Any],
                  pipe: Connection) -> None:
    """The process target (engine/distributed/workers.py): ``build_engine(config)`` is the replica's engine."""
    run_instance(pipe, f"replica {rank}", lambda: _serve(rank, num_replicas, config, build_engine, pipe))


def _serve(rank: int, num_replicas: int, config: Any, build_engine: Callable[[Any], Any], pipe: Connection) -> None:
    use_cores(num_replicas)
    engine = build_engine(config)
    kv = engine.kv
    pipe.send(("ready", ReplicaLimits(engine.max_model_len, engine.vocab_size, kv.num_blocks, kv.block_size,
                                      kv.watermark_blocks, engine.dtype_choice, engine.linear_kernels)))
    instance = f"replica-{rank}"
    while True:
        outputs, wait = [], not engine.has_unfinished()
        while wait or pipe.poll():
            kind, request_id, *rest = pipe.recv()
            wait = False
            if kind == "add":
                token_ids, params, arrival_time = rest
                try:
                    engine.add_request(token_ids, params, request_id=request_id, arrival_time=arrival_time)
                except ValueError as exc:  # the front end checked it against the same limits: not expected
                    outputs.append(refused(request_id, token_ids, arrival_time, str(exc)))
            elif kind == "abort":
                engine.abort(request_id)  # the front end ended it already
            else:
                engine.reset_prefix_cache()
        outputs += engine.step() if engine.has_unfinished() else []
        records = [dataclasses.replace(r, instance=instance) for r in engine.pop_batch_records()]
        if outputs or records:
            pipe.send(("outputs", outputs, records,
                       ReplicaLoad(engine.num_waiting, engine.num_running, engine.kv_usage())))
