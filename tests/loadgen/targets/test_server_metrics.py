"""Server metrics during a run (loadgen.targets.server_metrics): the FAKE SSE server's /metrics (its real
running and waiting streams, in vLLM's names) scraped and mapped, and a server without the page, or with
one that is not Prometheus text, still measured, its summary saying why it has no server metrics."""
from __future__ import annotations

import pandas as pd
import pytest

from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.targets.server_metrics import MetricsScraper
from stallfree.loadgen.workload.request_specs import build_workload
from tests.helpers.bench import url_run
from tests.helpers.fakes.fake_sse_server import running_fake_server


def test_the_fakes_queue_is_scraped_in_our_vocabulary():
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 8, "output": 16}, 10, 0, 1000)
    with running_fake_server(ttft_ms=20, tbt_ms=5, max_running=2) as url, MetricsScraper(url, 0.02) as scraper:
        records = run_open_loop_sync(url, specs, model="fake", timeout_s=30)
    assert all(r.status == "ok" for r in records)
    result = scraper.result
    assert result.engine == "vllm" and result.reason is None and result.scrapes >= 3
    rows = pd.DataFrame(result.rows)
    peaks = rows.groupby("metric")["value"].max()
    assert peaks["requests_running"] == 2 and peaks["kv_cache_usage"] == 1.0  # the fake's cap
    assert peaks["requests_waiting"] >= 4  # a burst of 10 against 2 places
    assert rows.loc[rows["metric"] == "requests_waiting", "value"].iloc[-1] == 0  # the final scrape: all done
    assert peaks["prefix_cache_queries_total"] == 10 * 8
    assert set(rows["series"]) >= {"vllm:num_requests_waiting", "vllm:num_preemptions_total"}


def test_a_disabled_scraper_says_so():
    with MetricsScraper("http://127.0.0.1:9", None) as scraper:
        pass
    assert scraper.result.engine is None and scraper.result.reason == "target.metrics_interval_s is null"


def test_a_saturated_url_run_records_its_server_series_and_queue_growth(tmp_path):
    with running_fake_server(ttft_ms=20, tbt_ms=5, max_running=2) as url:
        summary = url_run(url, tmp_path, "arrival=constant", "qps=50", "num_requests=60",
                          "target.metrics_interval_s=0.05")
        light = url_run(url, tmp_path, "arrival=constant", "qps=5", "num_requests=8", "target.metrics_interval_s=0.05")
    assert light["server_queue_growing"] is False and light["server_peak_waiting"] == 0  # served as they come
    assert summary["completed"] == 60
    assert summary["server_metrics"] == "vllm" and summary["server_metrics_reason"] is None
    assert summary["server_peak_running"] == 2 and summary["server_peak_kv_cache_usage"] == 1.0
    assert summary["server_peak_waiting"] >= 4 and summary["server_preemptions"] == 0
    assert summary["server_prefix_cache_hit_rate"] == 0.0
    assert summary["server_queue_growing"] is True  # offered 50/s, served at most about 2 / 0.1 s
    series = pd.read_parquet(tmp_path / "default" / summary["run_id"] / "server_metrics.parquet")
    assert list(series.columns) == ["time", "metric", "value", "series"]
    assert set(series["metric"]) >= {"requests_running", "requests_waiting", "kv_cache_usage"}


@pytest.mark.parametrize(("mode", "reason"), [("none", "answered HTTP 404"),
                                              ("garbage", "not in the Prometheus text format")])
def test_a_server_without_usable_metrics_is_still_measured(tmp_path, capsys, mode, reason):
    with running_fake_server(ttft_ms=5, tbt_ms=2, metrics=mode) as url:
        summary = url_run(url, tmp_path, "arrival=burst", "num_requests=4")
    assert summary["completed"] == 4
    assert summary["server_metrics"] is None and reason in summary["server_metrics_reason"]
    assert summary["server_peak_waiting"] is None and summary["server_queue_growing"] is None
    assert pd.read_parquet(tmp_path / "default" / summary["run_id"] / "server_metrics.parquet").empty
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[server metrics]")]
    assert len(printed) == 1 and reason in printed[0]
