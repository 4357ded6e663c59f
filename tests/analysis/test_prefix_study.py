"""The prefix-caching study's table and conclusion, from capacity records (capacity.json) of searches with the
engine's prefix cache off and on."""
import json

import pytest

from stallfree.analysis.prefix_study import prefix_conclusion, prefix_table


def record(scheduler, chunk, caching, capacity, bound="exact", run_id=None):
    return {"model": "mistral7b_a100", "workload": "chat", "slo_name": "strict", "scheduler": scheduler,
            "chunk_size": chunk, "prefix_caching": caching, "capacity_qps": capacity, "capacity_bound": bound,
            "capacity_display": f"{capacity:g} qps" if bound == "exact" else f">= {capacity:g} qps",
            "points": [{"qps": capacity, "passed": True, "run_id": run_id}] if run_id else []}


@pytest.fixture
def study(tmp_path):
    exp = tmp_path / "prefix"
    exp.mkdir()
    for run_id, ttft in (("v-off", 900.0), ("v-on", 300.0), ("s-off", 800.0), ("s-on", 120.0)):
        (exp / run_id).mkdir()
        (exp / run_id / "summary.json").write_text(json.dumps({"median_ttft_ms": ttft}))
    records = [record("vllm", None, False, 1.0, run_id="v-off"), record("vllm", None, True, 2.5, run_id="v-on"),
               record("sarathi", 512, False, 1.5, run_id="s-off"), record("sarathi", 512, True, 2.0, run_id="s-on"),
               record("sarathi", 256, False, 1.2), record("sarathi", 256, True, 3.0, bound="lower"),
               {**record("vllm", None, None, 9.0)}]  # a server's search: caching unknown, not the study's
    (exp / "capacity.json").write_text(json.dumps(records))
    return tmp_path


def test_capacity_off_and_on_side_by_side(study):
    table = prefix_table(study).set_index("config")
    assert list(table.index) == ["vllm", "sarathi-512", "sarathi-256"]
    assert table.loc["vllm", "capacity_ratio"] == 2.5 and table.loc["sarathi-512", "capacity_ratio"] == 2.0 / 1.5
    assert table["capacity_ratio"].isna()["sarathi-256"]  # a bound is no ratio
    assert table.loc["sarathi-512", "ttft_ms_off"] == 800.0 and table.loc["sarathi-512", "ttft_ms_on"] == 120.0


def test_the_conclusion_says_how_caching_moves_capacity_and_whether_the_ranking_holds(study):
    text = prefix_conclusion(study)
    assert "vllm 1 qps -> 2.5 qps (2.50x), TTFT p50 at capacity 900 -> 300 ms" in text
    assert "Ranking without caching: sarathi-512 > sarathi-256 > vllm; with it: sarathi-256 > vllm > sarathi-512" in text
    assert "the paper's ranking holds (sarathi above vllm)" in text  # sarathi-256's >= 3 qps passes vllm's 2.5


def test_no_study_no_lines(tmp_path):
    assert prefix_conclusion(tmp_path) is None and prefix_table(tmp_path).empty


def test_the_preset_keeps_one_experiment_per_workload():
    from hydra import compose, initialize_config_dir

    from stallfree.engine.hydra_config import CONF_DIR
    from stallfree.loadgen.config.checks import validate_cli

    validate_cli(["+experiment=prefix", "model=mistral7b_a100"])
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("bench", ["+experiment=prefix", "workload=agentic"], return_hydra_config=True)
    assert cfg.experiment_name == "prefix_agentic" and cfg.mode == "capacity"
    assert cfg.hydra.sweep.dir.endswith(".hydra/prefix")
