"""analysis.compare: engines in report order, capacities and ratios no stronger than the searches behind them."""
import json

import pandas as pd
import pytest

from stallfree.analysis.compare import compare_note, compare_runs, load_compare
from stallfree.analysis.load import engine_labels


def record(contender: str, target: str, scheduler: str, capacity: float, lo: float | None, hi: float | None,
           chunk_size: int | None = None, slo_tbt_ms: float = 100.0) -> dict:
    return {"contender": contender, "status": "measured", "reason": None, "target": target, "scheduler": scheduler,
            "chunk_size": chunk_size, "slo_name": "strict", "slo_tbt_ms": slo_tbt_ms,
            "slo_reference_method": "cost_model", "capacity_qps": capacity,
            "bracketed": lo is not None and hi is not None, "lo_qps": lo, "hi_qps": hi}


def write(tmp_path, records: list[dict]):
    exp_dir = tmp_path / "compare"
    exp_dir.mkdir()
    (exp_dir / "compare.json").write_text(json.dumps(records))
    return load_compare(tmp_path).set_index("engine")


def test_engine_labels_name_a_url_server_by_its_label_and_stallfree_by_policy_and_chunk():
    frame = pd.DataFrame({"target": ["url", "http", "http", "inprocess"], "scheduler": ["vllm 0.32.0 (url)", "vllm",
                          "sarathi", "sarathi"], "chunk_size": [None, None, 256, 512]})
    assert list(engine_labels(frame)) == ["vllm 0.32.0 (url)", "stallfree vllm", "stallfree sarathi-256",
                                          "stallfree sarathi-512"]


def test_the_url_server_comes_first_and_is_the_baseline_of_exact_ratios(tmp_path):
    table = write(tmp_path, [record("stallfree_sarathi", "http", "sarathi", 3.0, 3.0, 3.5, chunk_size=256),
                             record("stallfree_vllm", "http", "vllm", 1.5, 1.5, 1.75),
                             record("vllm_url", "url", "vllm", 2.0, 2.0, 2.25)])
    assert list(table.index) == ["vllm", "stallfree vllm", "stallfree sarathi-256"]
    assert (table["baseline"] == "vllm").all()
    assert list(table["capacity_text"]) == ["2", "1.5", "3"]
    assert list(table["ratio"]) == [1.0, 0.75, 1.5]
    assert list(table["ratio_text"]) == ["1.00x", "0.75x", "1.50x"]


@pytest.mark.parametrize(("engine", "baseline", "capacity_text", "ratio_text"), [
    ((4.0, 4.0, None), (2.0, 2.0, 2.5), ">= 4", ">= 2.00x"),        # max_qps passed: at least
    ((0.0, None, 0.5), (2.0, 2.0, 2.5), "< 0.5", "<= 0.25x"),       # nothing passed: below the lowest qps tried
    ((2.0, 2.0, 2.5), (4.0, 4.0, None), "2", "<= 0.50x"),           # the baseline is a lower bound
    ((2.0, 2.0, 2.5), (0.0, None, 0.5), "2", ">= 4.00x"),           # the baseline passed nothing
    ((4.0, 4.0, None), (4.0, 4.0, None), ">= 4", "?"),              # two lower bounds say nothing
    ((0.0, None, 0.5), (0.0, None, 0.5), "< 0.5", "?"),
])
def test_a_capacity_the_search_did_not_bracket_is_a_bound_and_so_is_its_ratio(tmp_path, engine, baseline,
                                                                               capacity_text, ratio_text):
    table = write(tmp_path, [record("vllm_url", "url", "vllm-server", *baseline),
                             record("stallfree_vllm", "http", "vllm", *engine)])
    row = table.loc["stallfree vllm"]
    assert (row["capacity_text"], row["ratio_text"]) == (capacity_text, ratio_text)
    assert pd.isna(row["ratio"])  # only an exact ratio is a number
    assert table.loc["vllm-server", "ratio_text"] == "1.00x"  # the baseline, bounded or not


def test_a_missing_contender_is_named_with_its_reason_and_the_next_engine_is_the_baseline(tmp_path):
    missing = {"contender": "vllm_url", "status": "missing", "reason": "no server answers at compare.vllm_url",
               "url": "http://127.0.0.1:8300"}
    table = write(tmp_path, [record("stallfree_sarathi", "http", "sarathi", 3.0, 3.0, 3.5, chunk_size=256),
                             record("stallfree_vllm", "http", "vllm", 1.5, 1.5, 1.75), missing])
    assert list(table.index) == ["vllm_url", "stallfree vllm", "stallfree sarathi-256"]
    assert table.loc["vllm_url", "capacity_text"] == "missing" and table.loc["vllm_url", "ratio_text"] == ""
    assert table.loc["stallfree sarathi-256", "ratio_text"] == "2.00x"
    note = compare_note(table.reset_index())
    assert "**Missing: `vllm_url`** (no server answers at compare.vllm_url)" in note
    assert "P99 TBT <= 100 ms (strict, cost_model) for every engine; ratios to stallfree vllm" in note


def test_engines_held_to_different_slos_are_said_not_to_compare(tmp_path):
    table = write(tmp_path, [record("vllm_url", "url", "vllm", 2.0, 2.0, 2.5, slo_tbt_ms=80.0),
                             record("stallfree_vllm", "http", "vllm", 2.0, 2.0, 2.5, slo_tbt_ms=100.0)])
    note = compare_note(table.reset_index())
    assert "**The engines were held to different SLOs** (vllm: 80 ms, stallfree vllm: 100 ms)" in note


def test_the_comparison_draws_only_the_runs_its_contenders_measured(tmp_path):
    measured = {**record("stallfree_vllm", "http", "vllm", 1.5, 1.5, 1.75), "run_ids": ["point"],
                "points": [{"qps": 1.5, "run_id": "probe"}]}
    table = write(tmp_path, [measured]).reset_index()
    runs = pd.DataFrame({"run_id": ["point", "probe", "left by earlier settings"], "target": "http",
                         "scheduler": "vllm", "chunk_size": None})
    drawn = compare_runs(runs, table)
    assert list(drawn["run_id"]) == ["point", "probe"] and set(drawn["engine"]) == {"stallfree vllm"}
