"""``stallfree-tune`` as a user runs it, on ``tiny``'s simulated runner (the live searches too: seconds, and the
same on any machine): the answer written, a second run read back from the cache, bad input one line and exit 2."""
import json
import os
import subprocess
import sys
from pathlib import Path

TUNE = Path(sys.executable).parent / "stallfree-tune"
ARGS = ["model=tiny", "model.runner=simulated", "model.clock=virtual", "model.cost_model=small-cpu.json",
        "slo=strict", "tune.chunk_sizes=[128,512]", "tune.confirm=1", "num_requests=16", "capacity.min_duration_s=5"]


def tune(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([TUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})


def test_a_tune_answers_with_the_best_measured_setting_and_resumes_from_its_cache(tmp_path):
    first = tune([*ARGS, f"results_dir={tmp_path}"], tmp_path)
    assert first.returncode == 0, first.stderr
    record = json.loads((tmp_path / "tune" / "tune.json").read_text())
    rows = record["settings"]
    assert len(rows) == 3 and {r["status"] for r in rows} == {"measured", "simulated"}
    assert [r["simulated_rank"] for r in rows] == [1, 2, 3]
    assert next(r for r in rows if r["own"])["status"] == "measured"  # the default is always measured
    measured = [r for r in rows if r["status"] == "measured"]
    assert len(measured) == 2 and rows[0]["status"] == "measured"  # the own setting and the best simulated
    best = max(measured, key=lambda r: r["measured_capacity_qps"])
    assert record["recommendation"] == best["label"] and record["answer"].startswith(best["label"])
    assert f"[tune] {record['answer']}" in first.stdout
    assert (tmp_path / "tune-simulated" / "capacity.json").is_file()
    assert f"**{record['answer']}**" in (tmp_path / "tune" / "tune.md").read_text()

    again = tune([*ARGS, f"results_dir={tmp_path}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert "[done]" not in again.stdout and "[cached]" in again.stdout
    assert json.loads((tmp_path / "tune" / "tune.json").read_text()) == record


def test_a_bad_tune_setting_is_one_line_and_exit_2(tmp_path):
    done = tune(["tune.policies=[nope]", f"results_dir={tmp_path}"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "stallfree-bench: config error: tune.policies must be a non-empty list of ['vllm', 'orca', 'faster_transformer', "
        "'sarathi', 'chunked_prefill', 'hybrid'], got ['nope']"]
