"""RunSummary: summary.json's keys declared once in typed parts, written flat with a version, read back from
every version this code knows."""
import json

import pytest

from stallfree.engine.records.run_summary import SUMMARY_VERSION, RunSummary, SummaryError, read_summary
from stallfree.engine.records.summary_parts import LatencyStats, RunParams


def a_summary() -> RunSummary:
    summary = RunSummary(params=RunParams(experiment="e", run_id="r", scheduler="sarathi", policy="sarathi",
                                          chunk_size=256, qps=2.0))
    summary.latency["ttft"] = LatencyStats(mean=10.0, median=9.0, p99_9=30.0)
    summary.placement.engine_cpus = [0, 1]
    return summary


def test_the_flat_form_round_trips_with_the_version_first_and_vllm_latency_names():
    flat = a_summary().flat()
    assert next(iter(flat)) == "summary_version" and flat["summary_version"] == SUMMARY_VERSION
    assert flat["mean_ttft_ms"] == 10.0 and flat["p99.9_ttft_ms"] == 30.0 and flat["p99_tbt_ms"] is None
    assert flat["engine_cpus"] == [0, 1] and flat["engine_label"] is None
    assert RunSummary.from_flat(json.loads(json.dumps(flat))) == a_summary()


def test_a_key_no_part_declares_is_an_error_naming_it_and_the_source():
    with pytest.raises(SummaryError, match="runs/r: unknown key.s. p42_ttft_ms, tokens_per_joule"):
        RunSummary.from_flat({**a_summary().flat(), "tokens_per_joule": 3, "p42_ttft_ms": 1.0}, "runs/r")


def test_nan_and_numpy_scalars_are_written_as_json_values():
    np = pytest.importorskip("numpy")
    flat = RunSummary.from_flat({"qps": np.float64(2.0), "duration": float("nan"), "completed": np.int64(3)}).flat()
    assert (flat["qps"], flat["duration"], flat["completed"]) == (2.0, None, 3)
    assert type(flat["completed"]) is int


def test_a_version_1_summary_gains_its_policy_from_scheduler_unless_a_server_ran_it(tmp_path):
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    ours.write_text(json.dumps({"scheduler": "vllm", "qps": 1.0, "median_ttft_ms": 5.0}))
    theirs.write_text(json.dumps({"scheduler": "vllm 0.32.0 (url)", "engine_label": "vllm 0.32.0 (url)"}))
    read = read_summary(ours)
    assert (read.params.policy, read.latency["ttft"].median, read.version) == ("vllm", 5.0, SUMMARY_VERSION)
    assert read_summary(theirs).params.policy is None


def test_a_summary_of_a_newer_version_is_an_error_that_says_so(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"summary_version": SUMMARY_VERSION + 1, "qps": 1.0}))
    with pytest.raises(SummaryError, match=f"summary version {SUMMARY_VERSION + 1} is newer"):
        read_summary(path)
