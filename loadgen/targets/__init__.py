"""Where a run replays its workload, one class per ``target.kind`` (conf/target/<kind>.yaml), each
implementing stallfree.loadgen.targets.base.Target. A kind's module is imported when the kind is used: none
imports torch until it is made, and the Locust target (loadgen/locust/target.py) can import this
package's protocol without a cycle."""
from __future__ import annotations

import importlib

from stallfree.engine.hydra_groups import require
from stallfree.loadgen.targets.base import Replay, Target, TargetClass

TARGETS: dict[str, str] = {  # kind -> "module:class"
    "inprocess": "stallfree.loadgen.targets.inprocess:InProcessTarget",
    "http": "stallfree.loadgen.targets.openai_server:HttpTarget",
    "url": "stallfree.loadgen.targets.openai_server:UrlTarget",
    "locust": "stallfree.loadgen.locust.target:LocustTarget",
}

__all__ = ["TARGETS", "Replay", "Target", "TargetClass", "target_class"]


def target_class(kind: str) -> TargetClass:
    require(kind in TARGETS, "target.kind", f"one of {sorted(TARGETS)}", kind)
    module, name = TARGETS[kind].split(":")
    return getattr(importlib.import_module(module), name)
