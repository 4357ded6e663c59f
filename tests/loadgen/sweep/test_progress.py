"""Sweep progress: the job count of a sweep as Hydra's basic sweeper plans it, and the per-run lines
with their place in the sweep and ETA (on a fake clock)."""
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from stallfree.engine.hydra_config import CONF_DIR, register_schema
from stallfree.loadgen.sweep import progress
from stallfree.loadgen.sweep.progress import RunPart, SweepProgress, duration, sweep_plan


def multirun_config(task_overrides: list[str]):
    """The config Hydra gives on_multirun_start: the composed preset, with the command line's sweep
    overrides as they were typed (compose() refuses sweeps outside a multirun, so they are set after)."""
    presets = [o for o in task_overrides if o.startswith("+experiment=")]
    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("bench", presets, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.overrides.task = task_overrides
    return cfg


@pytest.mark.parametrize("overrides, jobs, swept", [
    (["+experiment=demo"], 12, ("scheduler", "scheduler.chunk_size", "qps")),
    (["+experiment=demo", "qps=1,2", "seed=3"], 8, ("scheduler", "scheduler.chunk_size", "qps")),
    (["+experiment=demo", "scheduler=sarathi"], 6, ("scheduler.chunk_size", "qps")),
    (["scheduler=vllm,sarathi", "model.runner=model,simulated", "repeats=2"], 4, ("scheduler", "model.runner")),
])
def test_sweep_plan_counts_the_jobs_of_preset_and_command_line(overrides, jobs, swept):
    assert sweep_plan(multirun_config(overrides)) == (jobs, swept)


def test_sweep_plan_has_no_count_for_another_sweeper():
    cfg = multirun_config(["scheduler=vllm,sarathi"])
    cfg.hydra.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweep_plan(cfg) == (None, ("scheduler",))


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(progress.time, "time", fake)
    monkeypatch.setattr(progress, "_current", None)  # on_job_start sets this process's tracker
    return fake


def start_job(tracker: SweepProgress, num: int, task: list[str]) -> None:
    tracker.on_job_start(OmegaConf.create({"hydra": {"job": {"num": num}, "overrides": {"task": task}}}))


def test_lines_give_the_place_in_the_sweep_and_an_eta_from_the_measured_pace(clock, capsys):
    tracker = SweepProgress(total=4, swept=("scheduler", "qps"), started=clock.now)
    start_job(tracker, 0, ["scheduler=vllm", "qps=4", "num_requests=8"])
    assert progress.current() is tracker
    clock.now += 50
    line = tracker.run_ended({"scheduler": "vllm", "qps": 4.0}, RunPart(), 50.0, cached=False)
    assert line == "[1/4] scheduler=vllm qps=4 done in 50 s, ETA 2 min"  # 3 jobs left at 50 s each
    assert capsys.readouterr().out == line + "\n"
    start_job(tracker, 1, ["scheduler=sarathi", "qps=4", "num_requests=8"])
    clock.now += 30  # a repeat of two, then the job's last run
    line = tracker.run_ended({}, RunPart(0.5, {"seed": 1}), 30.0, cached=False)
    assert line == "[2/4] scheduler=sarathi qps=4 seed=1 done in 30 s, ETA 2 min"  # 80 s for 1.5 jobs
    assert tracker.eta() == ", ETA 2 min"
    start_job(tracker, 3, ["scheduler=sarathi", "qps=8"])
    clock.now += 80
    assert tracker.run_ended({}, RunPart(), 80.0, cached=False) == "[4/4] scheduler=sarathi qps=8 done in 80 s"


def test_runs_read_back_before_the_first_measurement_do_not_set_the_pace(clock):
    tracker = SweepProgress(total=10, swept=("qps",), started=clock.now)
    for num in range(5):  # a resumed sweep: its first half is cached
        start_job(tracker, num, [f"qps={num}"])
        clock.now += 0.1
        assert tracker.run_ended({}, RunPart(), 0.1, cached=True) == f"[{num + 1}/10] qps={num} cached"
    start_job(tracker, 5, ["qps=5"])
    clock.now += 60
    assert tracker.run_ended({}, RunPart(), 60.0, cached=False).endswith("done in 60 s, ETA 4 min")


def test_without_a_sweep_the_run_is_named_by_its_point(clock):
    tracker = SweepProgress(started=clock.now)
    start_job(tracker, 0, ["scheduler=sarathi", "num_requests=8"])
    point = {"scheduler": "sarathi", "chunk_size": 512, "qps": 1.0}
    clock.now += 2  # a capacity probe, a third of the way through the search
    assert tracker.run_ended(point, RunPart(1 / 3, {"qps": 2.0}), 2.0, cached=False) == \
        "[1/1] scheduler=sarathi chunk_size=512 qps=2 done in 2 s, ETA 4 s"
    unknown = SweepProgress(total=None)
    assert unknown.run_ended(point, RunPart(), 2.0, cached=False) == "[1/?] scheduler=sarathi chunk_size=512 qps=1 done in 2 s"


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (89, "89 s"), (90, "2 min"), (5399, "90 min"),
                                           (5400, "1.5 h")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_result_block_and_sweep_table_in_vllm_bench_serve_terms():
    from stallfree.loadgen.results.summary_block import result_block, sweep_table

    summary = {"completed": 10, "failed": 1, "duration": 5.0, "total_input_tokens": 100, "total_output_tokens": 50,
               "request_throughput": 2.0, "output_throughput": 10.0, "total_token_throughput": 30.0,
               "median_ttft_ms": 12.5, "p99_itl_ms": 7.25, "scheduler": "sarathi", "chunk_size": 512, "qps": 1.0}
    block = result_block(summary).splitlines()
    assert block[0].startswith("=") and "Serving Benchmark Result" in block[0]
    assert "Median TTFT (ms):                       12.50" in block and "P99 ITL (ms):                           7.25" in block
    assert "Output token throughput (tok/s):        10.00" in block and "Mean TPOT (ms):                         -" in block
    table = sweep_table([summary, {**summary, "scheduler": "vllm", "chunk_size": None, "disturbed": True}]).splitlines()
    assert table[0].split()[:3] == ["policy", "chunk", "qps"] and len(table) == 3
    assert table[2].split()[:2] == ["vllm", "-"] and table[2].endswith("disturbed")


def test_sweep_table_lists_a_run_that_two_jobs_share_once(clock, capsys):
    """vllm ignores chunk_size: its jobs at chunk_size=128 and 256 measure one run, then read it back."""
    tracker = SweepProgress(total=4, swept=("scheduler", "scheduler.chunk_size"), started=clock.now)
    base = {"completed": 8, "failed": 0, "qps": 1.0}
    runs = [("vllm", None, "vllm-1", False), ("vllm", None, "vllm-1", True),
            ("sarathi", 128, "sarathi-128-1", False), ("sarathi", 256, "sarathi-256-1", False)]
    for num, (scheduler, chunk, run_id, cached) in enumerate(runs):
        start_job(tracker, num, [f"scheduler={scheduler}", f"scheduler.chunk_size={chunk or 128 + 128 * num}"])
        tracker.run_ended({}, RunPart(), 1.0, cached=cached,
                          summary={**base, "scheduler": scheduler, "chunk_size": chunk, "run_id": run_id})
    tracker.on_multirun_end(OmegaConf.create({}))
    table = capsys.readouterr().out.split("sweep summary (3 runs):\n")[1].splitlines()
    assert [row.split()[0] for row in table[1:]] == ["vllm", "sarathi", "sarathi"]
