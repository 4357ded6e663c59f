"""The busiest process of a server's process tree (the engine). Servers are started with
stallfree.loadgen.targets.server_process.ServerProcess."""
from __future__ import annotations

from pathlib import Path

from stallfree.loadgen.sweep.cpu_share import sample


def descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in descendants(c)]


def busiest_process(pid: int) -> int:
    """The process of the tree under ``pid`` that has used the most CPU (the engine: vLLM's worker)."""
    return max([pid, *descendants(pid)], key=lambda p: sample(p).engine_cpu_s)
