from engine.scheduler import policies as _policies  # noqa: F401  (registers the policies)
from engine.scheduler.base import SCHEDULERS, Batch, ScheduledUnit, Scheduler, make_scheduler, register

__all__ = ["SCHEDULERS", "Batch", "ScheduledUnit", "Scheduler", "make_scheduler", "register"]
