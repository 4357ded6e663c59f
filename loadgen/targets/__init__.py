"""Where a run replays its workload, one class per ``target.kind`` (conf/target/<kind>.yaml), each
implementing loadgen.targets.base.Target. None of them imports torch until it is made."""
from __future__ import annotations

from stallfree.engine.hydra_groups import require
from stallfree.loadgen.locust.target import LocustTarget
from stallfree.loadgen.targets.base import Replay, Target, TargetClass
from stallfree.loadgen.targets.inprocess import InProcessTarget
from stallfree.loadgen.targets.openai_server import HttpTarget, UrlTarget

TARGETS: dict[str, TargetClass] = {
    "inprocess": InProcessTarget, "http": HttpTarget, "url": UrlTarget, "locust": LocustTarget,
}

__all__ = ["TARGETS", "Replay", "Target", "TargetClass", "target_class"]


def target_class(kind: str) -> TargetClass:
    require(kind in TARGETS, "target.kind", f"one of {sorted(TARGETS)}", kind)
    return TARGETS[kind]
