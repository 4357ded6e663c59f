"""vLLM --save-result files: a run exported and read back keeps its metrics under vLLM's definitions
(from the actual send), and vLLM result files land in load_runs beside stallfree runs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from stallfree.analysis import load
from stallfree.analysis.report import main as report_main
from stallfree.analysis.vllm_format import export_vllm
from stallfree.engine.records import RequestRecord
from stallfree.engine.records.request_metrics import summarize
from stallfree.engine.records.run_summary import RunSummary
from stallfree.loadgen.results.run_dir import requests_frame, write_run


def _records(n: int = 12, lag_s: float = 0.05) -> list[RequestRecord]:
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        intended = 1000.0 + i * 0.5
        sent = intended + lag_s
        times = list(sent + 0.1 + np.cumsum(rng.uniform(0.01, 0.03, 8)))
        record = RequestRecord(f"req-{i}", "ok", None, False, 20 + i, 8, 8, intended, sent, times[0],
                               times[-1] + 0.001, times)
        records.append(record)
    records[-1].end("error", "HTTP 500: boom", records[-1].finish_time)
    return records


@pytest.fixture
def exported(tmp_path):
    records = _records()
    summary = {"experiment": "exp", "run_id": "scheduler=vllm,qps=2.0", "scheduler": "vllm", "chunk_size": None,
               "qps": 2.0, "model": "tiny", "arrival": "poisson",
               **summarize(requests_frame(records), goodput="ttft:150 tpot:25")}
    write_run(tmp_path / "exp", summary["run_id"], config={}, requests=records, summary=RunSummary.from_flat(summary))
    [path] = export_vllm(load.load_runs(tmp_path / "exp"), tmp_path / "vllm")
    return summary, json.loads(path.read_text()), path


def test_export_has_vllm_keys_and_from_send_latencies(exported):
    summary, result, _ = exported
    for key in ("duration", "completed", "failed", "total_input_tokens", "request_throughput", "request_goodput",
                "output_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "input_lens",
                "ttfts", "itls", "errors", "request_rate", "model_id", "num_prompts"):
        assert key in result, key
    assert result["completed"] == 11 and result["failed"] == 1 and result["num_prompts"] == 12
    assert result["mean_ttft_ms"] == pytest.approx(summary["mean_ttft_from_send_ms"])
    assert result["mean_ttft_ms"] == pytest.approx(summary["mean_ttft_ms"] - 50.0)  # the 50 ms schedule lag
    assert result["p99_e2el_ms"] == pytest.approx(summary["p99_e2el_from_send_ms"])
    assert result["request_goodput"] == summary["request_goodput_vllm"] is not None
    assert result["errors"][-1] == "HTTP 500: boom" and result["output_lens"][-1] == 0
    assert np.mean(result["ttfts"][:-1]) * 1e3 == pytest.approx(result["mean_ttft_ms"])
    assert len(result["itls"][0]) == 7


def test_import_round_trip(exported, tmp_path):
    summary, _, path = exported
    runs = load.load_runs([tmp_path / "exp", path])
    ours, back = runs[runs["source"] != "vllm"].iloc[0], runs[runs["source"] == "vllm"].iloc[0]
    for key in ("output_throughput", "p99_tpot_ms", "mean_e2el_from_send_ms", "median_ttft_from_send_ms",
                "completed", "duration"):
        assert back[key] == pytest.approx(ours[key]), key
    assert back["p99_tbt_ms"] == pytest.approx(ours["p99_itl_ms"])
    assert back["median_ttft_ms"] == pytest.approx(ours["median_ttft_from_send_ms"])
    assert back["scheduler"] == "vllm" and back["qps"] == 2.0 and back["latency_origin"] == "send"


def test_plain_vllm_file_gets_labels_from_its_backend(tmp_path):
    path = tmp_path / "vllm-2.0qps-Llama.json"
    path.write_text(json.dumps({"backend": "vllm", "request_rate": "inf", "completed": 10,
                                "output_throughput": 55.0, "p99_itl_ms": 30.0, "median_ttft_ms": 80.0}))
    [row] = load.load_runs(path).to_dict("records")
    assert row["scheduler"] == "vllm-vllm" and np.isnan(row["qps"]) and row["p99_tbt_ms"] == 30.0
    assert row["config"] == "vllm-vllm"


def test_report_export_cli(exported, tmp_path, capsys):
    assert report_main([str(tmp_path / "exp"), "--export", "vllm", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "scheduler=vllm,qps=2.0.json").is_file()
