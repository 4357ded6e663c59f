"""Scheduling policies: one short class per file, registered by name in ``SCHEDULERS``."""
from engine.scheduler import chunked_prefill, faster_transformer, hybrid, orca, sarathi, vllm  # noqa: F401  (register)
from engine.scheduler.base import SCHEDULERS, Scheduler, make_scheduler, register
from engine.scheduler.output import ScheduledUnit, SchedulerOutput

__all__ = ["SCHEDULERS", "ScheduledUnit", "Scheduler", "SchedulerOutput", "make_scheduler", "register"]
