"""Where a run replays its workload, one class per ``target.kind`` (conf/target/<kind>.yaml), each
implementing stallfree.loadgen.targets.base.Target and registered in ``TARGETS``."""
from __future__ import annotations

from stallfree.loadgen.targets.base import TARGETS, Replay, Target, TargetClass

__all__ = ["TARGETS", "Replay", "Target", "TargetClass", "target_class"]


def target_class(kind: str) -> TargetClass:
    return TARGETS[kind]
