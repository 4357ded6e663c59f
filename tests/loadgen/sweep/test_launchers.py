"""The parallel launchers of conf/hydra/launcher/ against the basic one, on a capacity sweep of simulated
runs (model.runner=simulated on a virtual clock: the real schedulers, no forward pass):

* ``hydra/launcher=submitit_local``: the SLURM plugin's code path (submitit), jobs as local processes;
* ``hydra/launcher=local_parallel``: joblib, 2 worker processes; killed mid-sweep, then resumed.

Each gives the basic launcher's run directories, summary.parquet and capacity.json (CPU-share fields
aside). The sweep has duplicate jobs (vllm ignores chunk_size), which parallel workers run at once.
"""
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from stallfree.loadgen.sweep.cpu_share import CpuReport
from tests.helpers.bench import bench, kill_after_first_run, run_dirs

pytestmark = pytest.mark.slow

JOBS = 4  # scheduler x chunk_size
MACHINE_FIELDS = {f.name for f in dataclasses.fields(CpuReport)}  # this machine's load, not the run's
# No spread (residual 1.0): an iteration's time depends only on what it computes, so a run measures the
# same whether its engine is fresh (one per job) or reused (basic launcher).
COST_MODEL = {"coefficients": {"intercept": 0.004, "num_prefill_tokens": 5e-05, "num_decode_seqs": 0.0005},
              "residual_quantiles": [1.0], "fitted_on": {"model": "tiny", "by": "test_launchers"}}


@pytest.fixture(scope="module")
def sweep_args(tmp_path_factory, tiny_path) -> list[str]:
    """A capacity sweep of 4 jobs (tiny_path: the preset exists before parallel jobs read it)."""
    cost_model = tmp_path_factory.mktemp("cost") / "tiny-test.json"
    cost_model.write_text(json.dumps(COST_MODEL))
    return ["+experiment=capacity", "scheduler=vllm,sarathi", "scheduler.chunk_size=64,128", "slo=strict",
            "slo.tbt_ms=30", "model.runner=simulated", "model.clock=virtual", f"model.cost_model={cost_model}",
            "workload=fixed", "workload.lengths.prompt=64", "workload.lengths.output=16", "arrival=constant",
            "num_requests=16", "capacity.start_qps=32", "capacity.tolerance=0.25",
            "capacity.max_p50_scheduling_delay_s=0.02", "min_engine_cpu_share=0", "experiment_name=launch"]


def approx_floats(value):
    """Floats as pytest.approx (relative 1e-7), recursively. A reused engine's run starts later on the virtual
    clock: its times are exact on the clock's ticks, but the steady window's rates interpolate quantiles of
    those times and differ in the last bits (rounding to fixed digits would split a value straddling a
    boundary). Absolute 1e-6: a value near 0 (a client scheduling delay growth in ms)."""
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-7, abs=1e-6, nan_ok=True)
    if isinstance(value, dict):
        return {key: approx_floats(v) for key, v in value.items()}
    return [approx_floats(v) for v in value] if isinstance(value, list) else value


def comparable(value):
    """``value`` without the wall-clock times at which its references were measured (``*measured_at``) and
    the capacity points' ``reason`` (prose of numbers compared apart, printed to a few digits)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if not k.endswith("measured_at") and k != "reason"}
    return [comparable(v) for v in value] if isinstance(value, list) else value


def results(exp_dir: Path) -> dict:
    """What a sweep leaves that must not depend on the launcher."""
    runs = {}
    for d in run_dirs(exp_dir):
        summary = json.loads((d / "summary.json").read_text())
        config = yaml.safe_load((d / "config.yaml").read_text())
        config.pop("results_dir")
        if summary["chunk_size"] is None:  # a policy that ignores it: the jobs of every chunk size share
            config["scheduler"].pop("chunk_size")  # this run, and the one that ends first writes its config.yaml
        runs[d.name] = {"files": sorted(p.name for p in d.iterdir()), "config": config,
                        "summary": {k: v for k, v in summary.items() if k not in MACHINE_FIELDS}}
    table = pd.read_parquet(exp_dir / "summary.parquet").drop(columns=sorted(MACHINE_FIELDS), errors="ignore")
    rows = table.astype(object).where(table.notna(), None).sort_values("run_id").to_dict("records")
    return comparable({"runs": runs, "summary.parquet": rows,
                       "capacity.json": json.loads((exp_dir / "capacity.json").read_text())})


@pytest.fixture(scope="module")
def basic(sweep_args, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("basic")
    done = bench([*sweep_args, f"results_dir={root}"], root, timeout=600)
    assert done.returncode == 0, done.stderr
    expected = results(root / "launch")
    searches = expected["capacity.json"]
    assert len(searches) == 3 and any(s["bracketed"] for s in searches)  # vllm's two jobs: one search
    assert len(expected["runs"]) == sum(len(s["points"]) for s in searches)
    placed = [job for job in range(1, JOBS + 1) if f"\n[{job}/{JOBS}] scheduler=" in "\n" + done.stdout]
    # a line per probe, with the job's place in the sweep; vllm's second job is the search this process ran
    assert len(placed) == JOBS - 1 and done.stdout.count(": same search as scheduler=vllm") == 1
    assert "ETA" in done.stdout
    return expected


def test_submitit_local_matches_the_basic_launcher(sweep_args, basic, tmp_path):
    done = bench([*sweep_args, "hydra/launcher=submitit_local", f"results_dir={tmp_path}"], tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr
    exp_dir = tmp_path / "launch"
    assert results(exp_dir) == approx_floats(basic)
    logs = [log.read_text() for log in (exp_dir / ".hydra" / ".submitit").glob("*/*_log.out")]
    assert len(logs) == JOBS  # one process per job, each printing its own place in the sweep
    for job in range(1, JOBS + 1):
        assert sum(f"\n[{job}/{JOBS}] scheduler=" in "\n" + log for log in logs) == 1


def test_joblib_sweep_killed_midway_resumes_to_the_basic_results(sweep_args, basic, tmp_path):
    args = [*sweep_args, "hydra/launcher=local_parallel", f"results_dir={tmp_path}"]
    exp_dir = tmp_path / "launch"
    kill_after_first_run(args, tmp_path, exp_dir, timeout=600)
    complete = run_dirs(exp_dir)
    assert complete and all((d / "summary.json").is_file() for d in complete)
    incomplete = complete[0]  # as a run directory whose writing was cut short would be
    (incomplete / "summary.json").unlink()
    kept = {d.name: (d / "summary.json").stat().st_mtime_ns for d in complete[1:]}

    resumed = bench(args, tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    assert f"[done] {incomplete.name}" in resumed.stdout
    for name, mtime in kept.items():
        assert f"[cached] {name}" in resumed.stdout and f"[done] {name}" not in resumed.stdout
        assert (exp_dir / name / "summary.json").stat().st_mtime_ns == mtime
    assert results(exp_dir) == approx_floats(basic)
