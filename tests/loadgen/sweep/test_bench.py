"""stallfree-bench end to end on tiny: sweeps (in-process and HTTP), resume, a killed run, config errors."""
import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from stallfree.engine import choose_dtype
from stallfree.loadgen.config.checks import ConfigError, validate_cli
from stallfree.loadgen.results.run_dir import REQUESTS_SCHEMA
from tests.helpers.bench import bench, kill_after_first_run, run_dirs

SWEEP = ["-m", "scheduler=vllm,sarathi", "scheduler.chunk_size=128,256", "qps=4,8", "workload=fixed",
         "workload.lengths.prompt=32", "workload.lengths.output=8", "num_requests=4"]
UNIQUE_RUNS = 6  # vllm ignores chunk_size: its two chunk sizes are one run per qps


def check_sweep(exp_dir: Path, target: str, with_batches: bool) -> None:
    dirs = run_dirs(exp_dir)
    assert len(dirs) == UNIQUE_RUNS
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    sarathi = {("sarathi", c, q) for c in (128, 256) for q in (4.0, 8.0)}
    assert {(s["scheduler"], s["chunk_size"], s["qps"]) for s in summaries} == {
        ("vllm", None, 4.0), ("vllm", None, 8.0), *sarathi}
    for d, s in zip(dirs, summaries, strict=True):
        assert s["run_id"] == d.name and s["experiment"] == exp_dir.name and s["target"] == target
        assert s["completed"] == 4 and s["failed"] == 0 and s["slo_tbt_ms"] > 0
        assert s["dtype"] == choose_dtype("auto", "auto").name  # tiny's model.dtype, as the engine resolved it
        requests = pd.read_parquet(d / "requests.parquet")
        assert list(requests.columns) == REQUESTS_SCHEMA.names and (requests["output_tokens"] == 8).all()
        config = yaml.safe_load((d / "config.yaml").read_text())
        assert config["scheduler"]["policy"] == s["scheduler"] and config["qps"] == s["qps"]
        assert config["workload"]["lengths"] == {"kind": "fixed", "prompt": 32, "output": 8}
        assert (d / "batches.parquet").is_file() == with_batches
        # the gaps that ended in an iteration with prefill work: counted where the engine's iterations are known
        assert (0 <= s["tbt_prefill_gaps"] <= s["tbt_gaps"]) if with_batches else s["tbt_prefill_gaps"] is None
    table = pd.read_parquet(exp_dir / "summary.parquet")
    assert sorted(table["run_id"]) == [d.name for d in dirs]


@pytest.mark.slow
def test_inprocess_sweep_survives_a_kill_and_resumes(tmp_path):
    args = [*SWEEP, "experiment_name=sweep", f"results_dir={tmp_path / 'results'}"]
    exp_dir = tmp_path / "results" / "sweep"
    kill_after_first_run(args, tmp_path, exp_dir, timeout=120)
    completed = run_dirs(exp_dir)
    assert 1 <= len(completed) < UNIQUE_RUNS
    assert all((d / "summary.json").is_file() for d in completed)  # the killed run left no run dir

    resumed = bench(args, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("[done]") == UNIQUE_RUNS - len(completed)
    for d in completed:
        assert f"[cached] {d.name}" in resumed.stdout
    check_sweep(exp_dir, "inprocess", with_batches=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no Hydra outputs in the cwd

    again = bench(args, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("[cached]") == 8 and "[done]" not in again.stdout


@pytest.mark.slow
def test_http_sweep_restarts_the_server_only_for_server_knobs(tmp_path):
    args = [*SWEEP, "target=http", "experiment_name=http", f"results_dir={tmp_path}"]
    done = bench(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("[done]") == UNIQUE_RUNS and done.stdout.count("[cached]") == 2
    exp_dir = tmp_path / "http"
    check_sweep(exp_dir, "http", with_batches=True)
    logs = sorted((exp_dir / ".logs").glob("server-*.log"))
    assert len(logs) == 3  # vllm (any chunk size), sarathi-128, sarathi-256
    for log in logs:
        lines = log.read_text().splitlines()
        assert "stallfree-serve ready" in lines[0] and lines[-1] == "stallfree-serve: stopped"

    again = bench(args, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("[cached]") == 8 and len(list((exp_dir / ".logs").glob("*.log"))) == 3


@pytest.mark.parametrize("args, key", [
    (["scheduler=nope"], "scheduler: unknown option 'nope'"),
    (["-m", "qps=1,-2"], "qps must be a number > 0, got -2"),
    (["workload.lengths.name=missing_trace"], "workload.lengths.name: trace name 'missing_trace'"),
    (["no_such_key=1"], "no_such_key: unknown key"),
    (["model.runner=simulated", "model.clock=virtual", "target=http"], "model.clock must be 'real' unless"),
    (["target=http", "target.metrics_interval_s=0"], "target.metrics_interval_s must be a number > 0 or null"),
    (["arrival.max_concurrency=0"], "arrival.max_concurrency must be an integer >= 1 or null, got 0"),
    (["arrival.ramp_up_strategy=linear", "arrival.ramp_up_start_qps=8", "arrival.ramp_up_end_qps=2"],
     "arrival.ramp_up_end_qps must be > 0 and >= arrival.ramp_up_start_qps=8"),
])
def test_config_errors_are_one_line_naming_the_key(tmp_path, args, key):
    done = bench([*args, f"results_dir={tmp_path}"], tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"stallfree-bench: config error: {key}")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["+experiment=pareto", "model=path"], "model.model is required"),
    (["+experiment=pareto", "scheduler=sarathi", "scheduler.chunk_size=0"], "chunk_size must be an integer >= 1"),
    (["+experiment=capacity", "capacity.start_qps=1000"], "capacity.start_qps must be within"),
    (["target=url"], "target.url is required"),
    (["arrival=trace", "arrival.name=/no/such.csv"], "arrival.name: trace name '/no/such.csv'"),
    (["qps=[1"], "qps=[1: "),
    (["-m", "qps=1,2", "hydra/launcher=nope"], "hydra/launcher: unknown option 'nope'"),
    (["-m", "qps=1,2", "hydra/launcher=local_parallel", "hydra.launcher.n_jobs=two"],
     "hydra.launcher.n_jobs: Value 'two'"),
])
def test_validate_cli_checks_every_swept_value(args, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate_cli(args)


def test_validate_cli_accepts_the_presets():
    for preset in ("demo", "pareto", "capacity", "stall"):
        validate_cli([f"+experiment={preset}", "-m"])


@pytest.mark.slow
def test_a_run_says_and_records_its_dtype(tmp_path):
    """model.dtype=auto resolved as the engine does on this machine: on a line when the engine is built, in
    summary.json, and in the experiment's summary.parquet."""
    done = bench(["model.runner=simulated", "model.clock=virtual", "num_requests=2", "workload=fixed",
                  "workload.lengths.prompt=8", "workload.lengths.output=4", "slo.tbt_ms=1000", "experiment_name=dt",
                  f"results_dir={tmp_path}"], tmp_path)
    assert done.returncode == 0, done.stderr
    expected = choose_dtype("auto", "auto")
    assert f"[target] tiny in this process: dtype {expected}" in done.stdout.splitlines()
    [run_dir] = run_dirs(tmp_path / "dt")
    assert json.loads((run_dir / "summary.json").read_text())["dtype"] == expected.name
    assert pd.read_parquet(tmp_path / "dt" / "summary.parquet")["dtype"].tolist() == [expected.name]


@pytest.mark.slow
def test_simulated_sweep_on_a_virtual_clock(tmp_path):
    """model.runner=simulated model.clock=virtual: the real schedulers on simulated time, so a long
    workload at high load replays in a few seconds of wall time."""
    start = time.monotonic()
    done = bench(["-m", "model.runner=simulated", "model.clock=virtual", "scheduler=vllm,sarathi", "qps=200",
                  "num_requests=2000", "experiment_name=sim", f"results_dir={tmp_path}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 180
    summaries = [json.loads((d / "summary.json").read_text()) for d in run_dirs(tmp_path / "sim")]
    assert sorted(s["scheduler"] for s in summaries) == ["sarathi", "vllm"]
    for s in summaries:
        assert s["completed"] == 2000 and s["duration"] >= 2000 / 200 * 0.8  # simulated seconds


@pytest.mark.slow
def test_a_preset_sweeps_without_m_and_prints_each_runs_place(tmp_path):
    """conf/experiment presets set hydra.mode: MULTIRUN; the command line's values override the preset's
    sweep (pareto: 5 policies x 2 chunk sizes x 4 loads, here 2 policies x 1 x 2)."""
    args = ["+experiment=pareto", "scheduler=vllm,sarathi", "scheduler.chunk_size=64", "qps=4,8", "model.runner=simulated",
            "model.clock=virtual", "num_requests=4", f"results_dir={tmp_path}"]
    done = bench(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(run_dirs(tmp_path / "pareto")) == 4 and done.stdout.count("[done]") == 4
    lines = [line for line in done.stdout.splitlines() if line.startswith("[") and "/4]" in line]
    assert [line.split(" done in ")[0] for line in lines] == [
        "[1/4] scheduler=vllm qps=4", "[2/4] scheduler=vllm qps=8",
        "[3/4] scheduler=sarathi qps=4", "[4/4] scheduler=sarathi qps=8"]
    assert all(", ETA " in line for line in lines[:3])

    again = bench(["-m", *args], tmp_path)  # -m still works; a finished sweep is read back
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("[cached]") == 4 and "[4/4] scheduler=sarathi qps=8 cached" in again.stdout


@pytest.mark.slow
def test_rerun_disturbed_and_force_measure_a_complete_run_again(tmp_path):
    args = ["model.runner=simulated", "model.clock=virtual", "num_requests=4", "experiment_name=again",
            f"results_dir={tmp_path}"]
    assert bench(args, tmp_path).stdout.count("[done]") == 1
    assert bench([*args, "rerun=disturbed"], tmp_path).stdout.count("[cached]") == 1
    [run_dir] = run_dirs(tmp_path / "again")
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "disturbed": True, "engine_cpu_share": 0.5}))
    assert bench(args, tmp_path).stdout.count("[cached]") == 1
    again = bench([*args, "rerun=disturbed"], tmp_path)
    assert again.stdout.count("[done]") == 1 and not json.loads((run_dir / "summary.json").read_text())["disturbed"]
    forced = bench(["--force", *args], tmp_path)
    assert forced.returncode == 0 and forced.stdout.count("[done]") == 1
    assert "rerun must be one of" in bench([*args, "rerun=maybe"], tmp_path).stderr
