"""Sweep progress: one line per run with its place in the sweep and an ETA, on a TTY or in a log, e.g.
``[3/16] scheduler=sarathi scheduler.chunk_size=128 qps=4 done in 41 s, ETA 8 min``.

``SweepProgress`` is a Hydra callback (``hydra.callbacks`` in conf/bench.yaml). ``on_multirun_start``
counts the jobs as the basic sweeper plans them and notes the start; ``on_job_start`` makes it this
process's tracker, at the job's ``hydra.job.num``. Launchers that run jobs in other processes (joblib,
submitit) pickle the callbacks with the sweep, so every job gets the count and the start time. The
runs of a job (repeats, capacity probes) report to ``current()`` with the share of their job done.

The ETA is the measured pace (time since the sweep started, per job done) times the jobs left; runs
read back from a complete run directory before the first measured one are left out of the pace.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from stallfree.loadgen.results.summary_block import sweep_table

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass
class RunPart:
    """A run's place in its job: the share of the job done once it ends, and what tells it apart from
    the job's other runs (a repeat's seed, a capacity probe's qps)."""
    done: float = 1.0
    extras: dict = field(default_factory=dict)


def sweep_plan(config: DictConfig) -> tuple[int | None, tuple[str, ...]]:
    """The number of jobs and the swept keys of a multirun config, as the basic sweeper makes them of the
    preset's ``hydra.sweeper.params`` and the command line (the later value of a key wins); no count
    for another sweeper, or a sweep only the config loader can expand."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    params = [f"{key}={value}" for key, value in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        [jobs] = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    except HydraException:
        return None, ()
    swept = {o.get_key_element(): o.is_sweep_override() for o in overrides}
    known = OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER
    return len(jobs) if known else None, tuple(key for key, is_sweep in swept.items() if is_sweep)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _value(value) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


@dataclass
class SweepProgress(Callback):
    """The Hydra callback that tracks a sweep, and the tracker its jobs' runs report to."""

    total: int | None = 1  # jobs in the sweep; None when the sweeper's plan is unknown
    swept: tuple[str, ...] = ()  # the keys the sweep varies: they name a job's runs
    started: float = field(default_factory=time.time)  # epoch seconds: comparable across job processes
    job: int = 0  # hydra.job.num of the running job
    job_overrides: dict[str, str] = field(default_factory=dict)  # the running job's values of the swept keys
    skipped: float = 0.0  # jobs' worth of cached runs read back before the first measured run
    measured: bool = False
    finish_at: float | None = None  # epoch seconds the sweep is expected to end
    summaries: list[dict] = field(default_factory=list)  # of the runs this process measured or read back

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.total, self.swept = sweep_plan(config)
        self.started = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """A table of the sweep's runs (those of this process: the basic launcher runs them all here), each
        once: jobs that differ only in a knob the policy ignores read back the same run."""
        if len(self.summaries) > 1:
            print(f"\nsweep summary ({len(self.summaries)} runs):\n{sweep_table(self.summaries)}", flush=True)

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        global _current
        self.job = int(OmegaConf.select(config, "hydra.job.num", default=0))
        pairs = (override.split("=", 1) for override in config.hydra.overrides.task if "=" in override)
        self.job_overrides = {key: value for key, value in pairs if key in self.swept}
        _current = self

    def position(self) -> str:
        """``3/16``: this job's number of the sweep's jobs."""
        return f"{self.job + 1}/{self.total or '?'}"

    def eta(self) -> str:
        """``, ETA 8 min`` once the pace is known and jobs are left, else empty."""
        return "" if self.finish_at is None else f", ETA {duration(max(self.finish_at - time.time(), 0))}"

    def run_ended(self, point: dict, part: RunPart, seconds: float, cached: bool,
                  summary: dict | None = None) -> str:
        """Print and return the run's line. ``point``: what names the run when nothing is swept."""
        if summary is not None and summary.get("run_id") not in {s.get("run_id") for s in self.summaries}:
            self.summaries.append(summary)  # a point two jobs share (vllm at two chunk sizes) is one run
        now, done = time.time(), self.job + part.done
        if not cached:
            self.measured = True
        elif not self.measured:
            self.skipped, self.started = done, now
        left = (self.total or 0) - done
        pace_known = self.measured and self.total is not None and done > self.skipped and left > 0
        self.finish_at = now + (now - self.started) / (done - self.skipped) * left if pace_known else None
        label = " ".join(f"{k}={_value(v)}" for k, v in {**(self.job_overrides or point), **part.extras}.items())
        status = "cached" if cached else f"done in {duration(seconds)}"
        line = f"[{self.position()}] {label} {status}{self.eta()}"
        print(line, flush=True)
        return line


_current: SweepProgress | None = None  # the tracker of the job this process runs


def current() -> SweepProgress:
    """The running job's tracker; a one-job tracker when no Hydra sweep set one (a direct call)."""
    global _current
    if _current is None:
        _current = SweepProgress()
    return _current
