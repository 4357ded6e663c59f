"""Runners execute one ``SchedulerOutput`` each: the real model (``ModelRunner``) or a fitted cost model
(``SimulatedRunner``), behind the ``Runner`` protocol, with the clock the engine stamps times by."""
from stallfree.engine.runner.base import Runner
from stallfree.engine.runner.clock import Clock, VirtualClock, WallClock

__all__ = ["Clock", "Runner", "VirtualClock", "WallClock"]
