"""``stallfree-bench``: the Hydra app that runs one measured point per job (sweeps with ``-m``, or
``+experiment=NAME``: the presets set ``hydra.mode: MULTIRUN``).

A job builds the workload from its config, replays it on the target (conf/target: ``inprocess``, an
LLMEngine in this process; ``http``, a ``stallfree-serve`` it starts; ``url``, a running server;
``locust``, a headless Locust run) and writes ``<results_dir>/<experiment_name>/<run_id>/``
(loadgen.sweep.point). ``mode=capacity`` runs a capacity search instead (loadgen.sweep.capacity_search), each of its
points such a run; ``mode=compare`` (``+experiment=compare``) a contender's QPS points and then its capacity
search (loadgen.sweep.side_by_side); ``mode=tune`` (``stallfree-tune``) the setting with the most capacity,
searched in simulation and confirmed live (loadgen.sweep.tune).

Under the basic launcher the target is kept across the jobs of a sweep and replaced only when a
engine key (``model.*``, ``cache.*``, ``scheduler.*``) changes; other launchers make one per job. Every run
prints its place in the sweep and an ETA (loadgen.sweep.progress, a Hydra callback in conf/bench.yaml).
"""
from __future__ import annotations

import atexit
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from stallfree.engine.records.writable import results_dir_error
from stallfree.loadgen.config.checks import CONF_DIR, CONFIG_NAME, check, validate_cli
from stallfree.loadgen.config.errors import exit_on_error
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.point import run_repeats
from stallfree.loadgen.sweep.side_by_side import run_compare
from stallfree.loadgen.sweep.tune import run_tune

PROG = "stallfree-bench"
INTERRUPTED = "interrupted; complete runs are kept: run the same command again to resume"

_targets = LiveTarget()  # shared by the jobs this process runs
atexit.register(_targets.close)


def _keeps_targets() -> bool:
    """Only the basic launcher runs every job in this process, so only it can reuse a live target."""
    return "BasicLauncher" in str(HydraConfig.get().launcher.get("_target_", ""))


def _run(bench: BenchConfig) -> None:
    if bench.mode == "capacity":
        run_search(bench, _targets)
    elif bench.mode == "compare":  # engines side by side (+experiment=compare)
        run_compare(bench, _targets)
    elif bench.mode == "tune":  # the setting with the most capacity (+experiment=tune, stallfree-tune)
        run_tune(bench, _targets)
    elif bench.mode == "study":  # the characterisation studies (+experiment=phases, chunking, tiles)
        from stallfree.loadgen.studies import run_study  # torch: only once a study runs (--help stays fast)

        run_study(bench)
    else:
        run_repeats(bench, _targets)


@hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")
def _app(cfg: DictConfig) -> None:
    def job() -> None:
        bench = check(cfg)  # the only use of the raw config: from here on, typed (loadgen.config.schema)
        try:
            _run(bench)
        except OSError as e:  # a write into results_dir that failed mid-sweep (a full disk) ends as exit 2 too
            unwritable = results_dir_error(e, bench.results_dir)
            if unwritable is None:
                raise
            raise unwritable from e

    try:
        exit_on_error(PROG, job, INTERRUPTED)
    finally:
        if not _keeps_targets():
            _targets.close()


def main() -> None:
    if "--force" in sys.argv:  # measure every run again: rerun=all
        sys.argv = [arg for arg in sys.argv if arg != "--force"] + ["rerun=all"]
    exit_on_error(PROG, lambda: validate_cli(sys.argv[1:]))
    exit_on_error(PROG, _app, INTERRUPTED)


def capacity_main() -> None:
    """``stallfree-capacity ARGS``: ``stallfree-bench ARGS +experiment=capacity``."""
    sys.argv.append("+experiment=capacity")  # after any -m: Hydra takes overrides in one run
    main()


def tune_main() -> None:
    """``stallfree-tune ARGS``: ``stallfree-bench ARGS +experiment=tune``."""
    sys.argv.append("+experiment=tune")
    main()


if __name__ == "__main__":
    main()
