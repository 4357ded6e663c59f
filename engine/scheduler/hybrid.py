"""The paper's hybrid-batching-only ablation."""
from __future__ import annotations

from stallfree.engine.scheduler.base import SCHEDULERS
from stallfree.engine.scheduler.orca import OrcaScheduler


@SCHEDULERS.register("hybrid")
class HybridBatchingScheduler(OrcaScheduler):
    """Hybrid batches without chunking: every decode plus whole new prefills in one iteration (Orca's
    batches), with KV blocks grown as tokens arrive (as sarathi does) instead of reserved for the worst case,
    so it differs from ``sarathi`` only in not chunking prefills."""

    reserve_worst_case = False
