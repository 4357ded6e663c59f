"""The prefill instance of a disaggregated deployment (``parallel.disaggregation=1p1d``): an engine of its own in
a process of its own. It prefills each prompt it is sent (sampling one token it throws away), sends the KV of the
prompt's full blocks to the decode instance over a gloo group (``kv_link``), and announces it on its pipe with the
batch records since the last message.

Messages in, on the pipe: ``("add", request_id, token_ids)``, ``("abort", request_id)``, ``("reset", None)`` (its
prefix cache). Out: ``("ready",)``; ``("kv", request_id, num_tokens, shape, dtype, records)`` once the tensor's
send is posted (no tensor for ``num_tokens`` 0); ``("failed", request_id, error, records)``; ``("died", error)``.
The pipe closing stops it."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch.distributed as dist

from stallfree.engine.distributed.instance import run_instance
from stallfree.engine.distributed.kv_transfer import export_prefix
from stallfree.engine.distributed.rank_runner import use_cores

DECODE_RANK, PREFILL_RANK, WORLD_SIZE = 0, 1, 2
INSTANCE = "prefill-0"  # in its BatchRecords


def kv_link(store: dist.Store, rank: int, timeout_s: float) -> dist.ProcessGroupGloo:
    """The two instances' gloo group for the KV: a group of their own on the store, not torch.distributed's
    default group (one per process, which TP ranks or another engine in the process may hold). Returns when
    both have joined."""
    return dist.ProcessGroupGloo(dist.PrefixStore("stallfree/kv", store), rank, WORLD_SIZE,
                                 timedelta(seconds=timeout_s))


def serve_prefill(rank: int, port: int, timeout_s: float, config: Any, build_engine: Callable[[Any], Any],
                  pipe: Connection) -> None:
    """The process target (engine/distributed/workers.py): ``build_engine(config)`` is the prefill engine."""
    run_instance(pipe, "the prefill instance", lambda: _serve(rank, port, timeout_s, config, build_engine, pipe))


def _serve(rank: int, port: int, timeout_s: float, config: Any, build_engine: Callable[[Any], Any],
           pipe: Connection) -> None:
    use_cores(WORLD_SIZE)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, is_master=False, timeout=timedelta(seconds=timeout_s))
    engine = build_engine(config)
    pipe.send(("ready",))  # then both join the group
    _prefill(engine, pipe, kv_link(store, rank, timeout_s))


def _records(engine: Any) -> list[Any]:
    return [dataclasses.replace(record, instance=INSTANCE) for record in engine.pop_batch_records()]


def _prefill(engine: Any, pipe: Connection, link: dist.ProcessGroupGloo) -> None:
    from stallfree.engine.request import SamplingParams

    first_token_only = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    sends: list[Any] = []  # sends in flight: their tensors stay alive until they complete
    while True:
        wait = not engine.has_unfinished()
        while wait or pipe.poll():
            kind, request_id, *rest = pipe.recv()
            wait = False
            if kind == "add":
                try:
                    engine.add_request(rest[0], first_token_only, request_id=request_id)
                except ValueError as exc:  # the decode instance took it: the two disagree on a limit
                    pipe.send(("failed", request_id, f"the prefill instance refused it: {exc}", []))
            elif kind == "abort":
                engine.abort(request_id)
            else:
                engine.reset_prefix_cache()
        for out in engine.step(finished_only=True):
            if out.error is not None:
                pipe.send(("failed", out.request_id, out.error, _records(engine)))
            elif out.finish_reason != "abort":
                prefix = export_prefix(engine.kv, engine.runner, out.prompt_token_ids)
                tensor = prefix.kv.contiguous()
                if prefix.num_blocks:  # a prompt shorter than two blocks sends no KV (its last block is computed)
                    sends.append((link.send([tensor], DECODE_RANK, 0), tensor))
                pipe.send(("kv", out.request_id, len(prefix.token_ids), tuple(tensor.shape), str(tensor.dtype),
                           _records(engine)))
        sends = [(work, tensor) for work, tensor in sends if not work.is_completed()]
