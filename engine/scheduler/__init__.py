"""Scheduling policies: one short class per file, registered by name in ``SCHEDULERS``."""
from engine.scheduler import chunked_prefill, faster_transformer, orca, sarathi, vllm  # noqa: F401  (register)
from engine.scheduler.base import SCHEDULERS, Batch, ScheduledUnit, Scheduler, make_scheduler, register

__all__ = ["SCHEDULERS", "Batch", "ScheduledUnit", "Scheduler", "make_scheduler", "register"]
