"""The Target protocol: what a run replays its workload on (an engine in this process, a server), and
the registry of target classes by ``target.kind`` (conf/target/<kind>.yaml)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from stallfree.engine.records import BatchRecord, RequestRecord, RequestSpec
from stallfree.engine.registry import Registry

if TYPE_CHECKING:
    from stallfree.loadgen.config.schema import BenchConfig
    from stallfree.loadgen.targets.server_metrics import ServerMetrics

Progress = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class RequestShape:
    """What each request carries: a token-id prompt (else text) and ``ignore_eos``."""

    token_ids: bool
    ignore_eos: bool

    @property
    def prompt_form(self) -> str:
        return "token_ids" if self.token_ids else "text"


ENGINE_SHAPE = RequestShape(token_ids=True, ignore_eos=True)  # an engine in this process takes both


@dataclass
class Replay:
    records: list[RequestRecord]  # one per spec, in spec order
    batches: list[BatchRecord] | None  # the engine's iterations during the replay, when the target can see them
    server_metrics: ServerMetrics | None = None  # the server's /metrics during the replay; None: no server
    # whether the target's prefix cache was emptied before the replay: reset, or not reset: why
    prefix_cache_reset: str | None = None


class Target(Protocol):
    """Made by ``TargetClass(cfg, log_dir)`` (log_dir: where a target keeps its logs and scratch files)."""

    vocab_size: int  # prompt token ids are drawn below it
    engine_pid: int | None  # the engine's process on this machine (its CPU share is measured), else None
    client_nice: int  # added to the calling thread's nice value for the load generator while it replays
    request_shape: RequestShape  # what each request carries (loadgen.targets.server_check.probe_request_shape)
    engine_label: str | None  # a server the bench did not start: what it says it is (ServerInfo.label)

    def replay(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        """Send the specs on their schedule; the first ``warmup`` records are marked is_warmup."""

    def finalize(self, run_dir: Path) -> None:
        """Called once the last replay is recorded in run_dir: keep the target's own outputs there."""

    def close(self) -> None:
        """Release what the target holds (an engine, a server process)."""


TargetClass = Callable[["BenchConfig", Path], Target]
# A kind's module registers its class when the kind is first used: none imports torch until it is made,
# and the Locust target (loadgen/locust/target.py) lives outside this package.
TARGETS: Registry[TargetClass] = Registry("target.kind", modules={
    "inprocess": "stallfree.loadgen.targets.inprocess",
    "http": "stallfree.loadgen.targets.openai_server",
    "url": "stallfree.loadgen.targets.openai_server",
    "locust": "stallfree.loadgen.locust.target",
})
