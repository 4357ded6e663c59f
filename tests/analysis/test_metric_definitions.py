"""analysis/ computes per-request latencies with loadgen's definitions, and reads chunking from the data."""
import dataclasses

import pandas as pd
import pytest

from stallfree.analysis import load
from stallfree.engine.records import RequestRecord
from stallfree.engine.records.request_metrics import summarize
from stallfree.engine.records.run_summary import RunSummary
from stallfree.loadgen.results.run_dir import requests_frame, write_run

T0 = 1000.0


def record(request_id: str, token_times: list[float], finish: float) -> RequestRecord:
    """An ok request sent on schedule at T0, whose response ends at ``finish`` (after its last token)."""
    return RequestRecord(
        request_id=request_id, status="ok", error=None, is_warmup=False, prompt_tokens=8, max_tokens=3,
        output_tokens=len(token_times), intended_send_time=T0, send_time=T0 + 0.001,
        first_token_time=T0 + token_times[0], finish_time=T0 + finish, token_times=[T0 + t for t in token_times],
        server_arrival_time=T0 + 0.002, server_first_scheduled_time=T0 + 0.012)


def write_one_run(exp_dir, records: list[RequestRecord], **params) -> dict:
    summary = {"experiment": exp_dir.name, "run_id": "run", "scheduler": "vllm", "chunk_size": None, "qps": 1.0,
               **params, **summarize(requests_frame(records))}
    write_run(exp_dir, "run", config={}, requests=records, summary=RunSummary.from_flat(summary))
    return summary


def test_e2e_ends_at_finish_time_in_loadgen_and_analysis(tmp_path):
    records = [record("a", [0.100, 0.120, 0.150], finish=0.400)]  # the response ends 250 ms after its last token
    summary = write_one_run(tmp_path / "exp", records)
    frame = load.load_requests(tmp_path)
    assert summary["median_e2el_ms"] == pytest.approx(400.0)
    assert frame["e2el_ms"].tolist() == frame["e2e_ms"].tolist() == [pytest.approx(400.0)]
    assert frame["ttft_ms"].tolist() == [pytest.approx(summary["median_ttft_ms"])] == [pytest.approx(100.0)]
    assert frame["tpot_ms"].tolist() == [pytest.approx(summary["median_tpot_ms"])] == [pytest.approx(150.0)]
    assert frame["scheduling_delay_ms"].tolist() == [pytest.approx(summary["median_scheduling_delay_ms"])]


def test_failed_requests_have_no_latency_when_kept(tmp_path):
    failed = dataclasses.replace(record("f", [0.1], finish=0.3), status="error", error="boom")
    write_one_run(tmp_path / "exp", [record("a", [0.1, 0.2], finish=0.2), failed])
    everything = load.load_requests(tmp_path, measured_only=False).set_index("request_id")
    assert everything.loc["a", "e2e_ms"] == pytest.approx(200.0)
    assert pd.isna(everything.loc["f", "e2e_ms"]) and pd.isna(everything.loc["f", "ttft_ms"])
    assert load.load_requests(tmp_path)["request_id"].tolist() == ["a"]


def test_chunking_comes_from_the_recorded_chunk_size():
    frame = pd.DataFrame({"scheduler": ["vllm", "sarathi", "a_new_policy", "another"],
                          "chunk_size": [None, 512, 256, float("nan")]})
    labelled = load.label_configs(frame)
    assert labelled["config"].tolist() == ["vllm", "sarathi-512", "a_new_policy-256", "another"]
    assert labelled["chunk"].tolist() == ["none", "512", "256", "none"]
    assert str(labelled["chunk_size"].dtype) == "Int64"
