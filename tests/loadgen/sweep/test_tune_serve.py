"""tune.serve_cmd (loadgen/sweep/tune_serve.py): the order a served grid is searched in, with the measurement
stood in for; then ``stallfree-tune`` on the fake OpenAI server started per setting, as a user runs it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.tune_serve import ServedTune, coarse, neighbours

BIN = Path(sys.executable).parent
FAKE = Path(__file__).parents[2] / "helpers" / "fakes" / "fake_sse_server.py"
SHORT = ["workload=fixed", "workload.lengths.prompt=16", "workload.lengths.output=8", "num_requests=16",
         "capacity.min_duration_s=1", "capacity.max_requests=128", "slo=strict", "slo.tbt_ms=1000",
         "capacity.start_qps=8", "capacity.max_qps=32", "capacity.tolerance=0.5"]


def served_cfg(tmp_path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["+experiment=tune", "target=url", "target.url=http://127.0.0.1:9",
                                            f"results_dir={tmp_path}", *overrides]))


def test_coarse_takes_every_other_value_and_the_last_and_neighbours_stay_on_the_grid():
    assert [coarse(n) for n in (1, 2, 4, 5)] == [[0], [0, 1], [0, 2, 3], [0, 2, 4]]
    assert sorted(neighbours((0, 1), (3, 2))) == [(0, 0), (1, 1)]


def test_the_search_climbs_from_the_best_of_the_coarse_pass_and_skips_a_failed_server(tmp_path, monkeypatch):
    cfg = served_cfg(tmp_path, "tune.serve_cmd='serve --port {port} --budget {chunk_size}'",
                     "tune.chunk_sizes=[128,256,512,1024,2048]")
    capacity = {128: 1.0, 256: 2.0, 512: 3.0, 1024: 2.5, 2048: 0.5}
    tune, order = ServedTune(cfg, targets=None), []

    def measure(cell):
        order.append(tune.chunks[cell[0]])
        if tune.chunks[cell[0]] == 256:
            tune.failed[cell] = "serve exited with status 1"
        else:
            tune.measured[cell] = {"capacity_qps": capacity[tune.chunks[cell[0]]]}

    monkeypatch.setattr(tune, "measure", measure)
    tune.run()
    assert order == [128, 512, 2048, 256, 1024]  # coarse, then both neighbours of 512
    assert tune.untried() == [] and not tune.dropped


def test_max_minutes_names_the_settings_left(tmp_path, monkeypatch, capsys):
    cfg = served_cfg(tmp_path, "tune.serve_cmd='serve --port {port} --budget {chunk_size}'",
                     "tune.chunk_sizes=[128,256,512]", "tune.max_minutes=1")
    tune = ServedTune(cfg, targets=None)
    clock = iter([0.0, 0.0, 40.0, 80.0])
    monkeypatch.setattr("stallfree.loadgen.sweep.tune_serve.time.monotonic", lambda: next(clock))
    monkeypatch.setattr(tune, "measure", lambda cell: tune.measured.__setitem__(cell, {"capacity_qps": 1.0}))
    tune.run()
    assert list(tune.measured) == [(0, 0)] and tune.dropped == [(2, 0)]  # 40 s a setting: a second would end at 80
    assert "[tune] tune.max_minutes=1: 1 settings fit; dropped: chunk 512" in capsys.readouterr().out


def fake_command(marker: str, extra: str = "") -> str:
    # a shell in front, as a user's wrapper script would be: the whole process group is stopped
    return (f"sh -c 'test {{max_num_seqs}} -ne 2 || exit 3; exec {sys.executable} {FAKE} --port {{port}} "
            f"--max-running {{max_num_seqs}} --ttft-ms 20 --tbt-ms 5 --model {marker} {extra}'")


def tune(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.run([BIN / "stallfree-tune", "target=url", f"target.url=http://127.0.0.1:{port}",
                           f"tune.serve_cmd={json.dumps(command)}", *SHORT, *args, f"results_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"})


def no_process_runs(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1


@pytest.mark.slow
def test_a_served_tune_measures_each_setting_on_its_own_server_and_names_the_one_that_did_not_start(tmp_path):
    marker = f"fake-tune-{os.getpid()}"
    done = tune(tmp_path, fake_command(marker), "tune.max_num_seqs=[1,2,8]")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "tune" / "tune.json").read_text())
    rows = {r["max_num_seqs"]: r for r in record["settings"]}
    assert rows[2]["status"] == "failed" and "exited with status 3" in rows[2]["reason"]
    assert rows[1]["status"] == rows[8]["status"] == "measured"
    assert rows[8]["measured_capacity_qps"] > rows[1]["measured_capacity_qps"]  # 8 streams at once against 1
    assert record["recommendation"] == "max_num_seqs 8" and record["live_target"] == "url"
    assert no_process_runs(marker)


def test_a_server_that_dies_during_its_search_fails_its_setting_and_leaves_no_process(tmp_path):
    marker = f"fake-dies-{os.getpid()}"
    done = tune(tmp_path, fake_command(marker, "--die-after 6"), "tune.max_num_seqs=[4]")
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads((tmp_path / "tune" / "tune.json").read_text())["settings"]
    assert row["status"] == "failed" and row["reason"], row
    assert "no setting was measured" in json.loads((tmp_path / "tune" / "tune.json").read_text())["answer"]
    assert no_process_runs(marker)
