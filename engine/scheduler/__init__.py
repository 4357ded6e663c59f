"""Scheduling policies: one short class per file, registered by name in ``SCHEDULERS`` (engine/registry.py)."""
from stallfree.engine.scheduler import chunked_prefill, faster_transformer, hybrid, orca, sarathi, vllm  # noqa: F401  (register)
from stallfree.engine.scheduler.base import SCHEDULERS, Scheduler, make_scheduler
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput

__all__ = ["SCHEDULERS", "ScheduledUnit", "Scheduler", "SchedulerOutput", "make_scheduler"]
