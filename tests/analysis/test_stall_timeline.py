"""The report's stall timeline for runs on a server the bench did not start (target=url, here the FAKE SSE
server): the client's TBT beside the server's queue and KV-cache usage from its /metrics, and a run without
server metrics saying why in its panels."""
from __future__ import annotations

import pytest

from stallfree.analysis import load, plots, stalls
from tests.helpers.bench import url_run
from tests.helpers.fakes.fake_sse_server import running_fake_server


def timeline(results_dir):
    runs = load.load_runs(results_dir)
    chosen = stalls.representative_runs(runs)
    gaps = load.token_gaps(load.load_requests(chosen))
    return plots.stall_timeline_plot(chosen, load.load_batches(runs), gaps, {"strict": 50.0},
                                     server=load.load_server_metrics(chosen))


def panels(fig) -> dict[str, object]:
    return {ax.get_ylabel(): ax for ax in fig.axes if ax.get_ylabel()}


@pytest.fixture(scope="module")
def url_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("url")
    with running_fake_server(ttft_ms=20, tbt_ms=5, max_running=2) as url:
        url_run(url, root, "arrival=constant", "qps=40", "num_requests=16", "target.metrics_interval_s=0.05")
    return root


def test_a_url_runs_timeline_shows_its_servers_queue_and_kv_usage(url_results):
    server = load.load_server_metrics(load.load_runs(url_results))
    assert set(server["metric"]) >= {"requests_running", "requests_waiting", "kv_cache_usage"}
    assert (server["scheduler"] == "fake-engine 1.2.3 (url)").all()  # run keys joined: labelled by the server
    by_label = panels(timeline(url_results))
    assert list(by_label) == ["Requests", "KV cache used (%)", "TBT (ms)"]  # no batch records: no engine rows
    assert len(by_label["Requests"].get_lines()) == 2 and len(by_label["KV cache used (%)"].get_lines()) == 1
    assert max(by_label["Requests"].get_lines()[0].get_ydata()) == 2  # running: the fake's cap
    assert by_label["TBT (ms)"].get_lines()


def test_a_run_without_server_metrics_says_why(tmp_path):
    with running_fake_server(ttft_ms=5, tbt_ms=2, metrics="none") as url:
        url_run(url, tmp_path, "arrival=burst", "num_requests=4")
    by_label = panels(timeline(tmp_path))
    texts = [t.get_text() for t in by_label["Requests"].texts]
    assert len(texts) == 1 and texts[0].startswith("no server metrics: GET http://127.0.0.1:")
    assert "HTTP 404" in texts[0].replace("\n", " ") and not by_label["Requests"].get_lines()
