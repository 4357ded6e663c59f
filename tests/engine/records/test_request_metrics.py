import dataclasses
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from stallfree.engine.records import RequestRecord
from stallfree.engine.records.request_metrics import LATENCY_METRICS, summarize
from stallfree.engine.records.run_summary import RunSummary
from stallfree.loadgen.results.run_dir import (
    REQUESTS_SCHEMA,
    is_complete,
    make_run_id,
    rebuild_experiment_summary,
    requests_frame,
    write_run,
)
from tests.helpers.batch_records import example_batch_record

T0 = 1000.0


def row(rid, intended, send, tokens, *, status="ok", prompt=10, warmup=False, server=None) -> RequestRecord:
    arrival, scheduled = server or (None, None)
    return RequestRecord(
        request_id=rid, status=status, error=None if status == "ok" else "boom", is_warmup=warmup,
        prompt_tokens=prompt, max_tokens=8, output_tokens=len(tokens), intended_send_time=T0 + intended,
        send_time=T0 + send, first_token_time=T0 + tokens[0] if tokens else None,
        finish_time=T0 + (tokens[-1] if status == "ok" else 1.9), token_times=[T0 + t for t in tokens],
        server_arrival_time=None if arrival is None else T0 + arrival,
        server_first_scheduled_time=None if scheduled is None else T0 + scheduled)


def example_rows() -> list[RequestRecord]:
    """Hand-computed example (times in seconds after T0):

    r1: ttft 100 ms (99 from send), gaps 20, 30 -> e2e 150, tpot 25, normalized 50, sched 10 ms
    r2: one token: ttft = e2e = 200 ms (197 from send), no tpot, no gaps, no server times
    r3: ttft 50, gaps 10, 10, 10 -> e2e 80, tpot 10, normalized 20, sched 5 ms
    f1: failed (one token then an error, finish at 1.9 s): counted, not in latency stats
    w: warm-up with absurd times: ignored everywhere
    """
    return [
        row("w", -5.0, -4.0, [-1.0, 0.9], prompt=999, warmup=True, server=(-4.0, 0.0)),
        row("r1", 0.0, 0.001, [0.100, 0.120, 0.150], prompt=10, server=(0.002, 0.012)),
        row("r2", 0.5, 0.503, [0.700], prompt=20),
        row("r3", 1.0, 1.0, [1.050, 1.060, 1.070, 1.080], prompt=30, server=(1.001, 1.006)),
        row("f1", 1.5, 1.5, [1.6], status="error", prompt=40, server=(1.5, 1.5)),
    ]


def test_summary_matches_hand_computation():
    s = summarize(requests_frame(example_rows()))
    approx = pytest.approx
    duration = 1.9  # last finish (the failed request's) - first intended send
    assert (s["completed"], s["failed"]) == (3, 1)
    assert s["duration"] == approx(duration)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 8)
    assert s["request_throughput"] == approx(3 / duration)
    assert s["output_throughput"] == approx(8 / duration)
    assert s["total_token_throughput"] == approx(68 / duration)
    assert s["request_goodput"] == approx(3 / duration)  # no SLO given: every ok request is good

    assert s["mean_ttft_ms"] == approx(350 / 3)
    assert s["median_ttft_ms"] == approx(100)
    assert s["p90_ttft_ms"] == approx(180)  # linear interpolation over [50, 100, 200]
    assert s["std_ttft_ms"] == approx(pd.Series([100, 200, 50]).std(ddof=0))
    assert s["median_ttft_from_send_ms"] == approx(99)
    assert (s["mean_tpot_ms"], s["median_tpot_ms"]) == (approx(17.5), approx(17.5))  # r2 has no TPOT
    for name in ("tbt", "itl"):  # pooled gaps [20, 30, 10, 10, 10]
        assert s[f"mean_{name}_ms"] == approx(16)
        assert s[f"median_{name}_ms"] == approx(10)
        assert s[f"p99_{name}_ms"] == approx(29.6)
        assert s[f"p99.9_{name}_ms"] == approx(29.96)
    assert s["mean_e2el_ms"] == approx(430 / 3)
    assert s["median_e2el_ms"] == approx(150)
    assert s["mean_normalized_latency_ms"] == approx(90)
    assert s["mean_scheduling_delay_ms"] == approx(7.5)  # r2 has no server times, f1 failed

    # validity: lags [1, 3, 0, 0] ms over all non-warm-up rows, failed included
    assert s["schedule_lag_p50_ms"] == approx(0.5)
    assert s["schedule_lag_p99_ms"] == approx(2.94)
    assert s["schedule_lag_max_ms"] == approx(3)
    assert s["offered_rate"] == approx(2.0)
    assert s["achieved_rate"] == approx(3 / 1.499)
    assert s["client_fell_behind"] is False
    assert s["slo_tbt_ms"] is None and s["slo_ttft_ms"] is None


@pytest.mark.parametrize(("slos", "good"), [
    ({"slo_ttft_ms": 150}, 2),  # r2's 200 ms TTFT misses
    ({"slo_tbt_ms": 25}, 2),  # r1's 30 ms gap misses; r2 has no gaps
    ({"slo_ttft_ms": 150, "slo_tbt_ms": 25}, 1),
    ({"slo_e2e_ms": 100}, 1),
    ({"slo_ttft_ms": 1000, "slo_tbt_ms": 1000, "slo_e2e_ms": 1000}, 3),  # f1 is never good
])
def test_goodput_counts_ok_requests_meeting_all_slos(slos, good):
    s = summarize(requests_frame(example_rows()), **slos)
    assert s["request_goodput"] == pytest.approx(good / 1.9)
    assert s["slo_ttft_ms"] == slos.get("slo_ttft_ms")


def test_client_fell_behind_on_lag_or_rate():
    late = example_rows()
    late[2].send_time += 0.050  # 50 ms lag on one of four requests: p99 lag > 10 ms, same rate
    s = summarize(requests_frame(late))
    assert s["achieved_rate"] == pytest.approx(3 / 1.499) and s["client_fell_behind"] is True
    slow = [row(f"r{i}", intended, send, [send + 0.01])
            for i, (intended, send) in enumerate([(0.0, 0.0), (0.05, 0.055), (0.1, 0.1095)])]
    s = summarize(requests_frame(slow))  # lags <= 9.5 ms, but only 91 % of the offered rate
    assert s["schedule_lag_p99_ms"] < 10
    assert (s["offered_rate"], s["achieved_rate"]) == (pytest.approx(20), pytest.approx(2 / 0.1095))
    assert s["client_fell_behind"] is True


def test_summary_has_every_contract_key_and_handles_no_successes():
    rows = [row("f", 0.0, 0.0, [], status="timeout")]
    s = summarize(requests_frame(rows))
    for name in LATENCY_METRICS:
        for stat in ("mean", "std", "median", "p90", "p95", "p99", "p99.9"):
            assert s[f"{stat}_{name}_ms"] is None
    assert (s["completed"], s["failed"], s["duration"], s["request_goodput"]) == (0, 1, pytest.approx(1.9), 0.0)
    assert s["offered_rate"] is None  # a single request has no rate


def test_run_id_is_deterministic_and_filesystem_safe():
    params = {"scheduler": "sarathi", "chunk_size": 256, "qps": 1.0}
    assert make_run_id(params) == "scheduler=sarathi,chunk_size=256,qps=1.0"
    assert make_run_id({"model": "/ckpt/llama 2", "x": None}) == "model=_ckpt_llama_2,x=None"
    long_a, long_b = make_run_id({"k": "a" * 300}), make_run_id({"k": "a" * 299 + "b"})
    assert len(long_a) <= 180 and long_a != long_b and "/" not in long_a


def test_write_run_round_trip_and_experiment_summary(tmp_path):
    rows = example_rows()
    summary = {"experiment": "exp", "run_id": "qps=1", "workload": {"kind": "fixed"},
               **summarize(requests_frame(rows))}
    run_dir = write_run(tmp_path / "exp", "qps=1", config={"qps": 1}, requests=rows, summary=RunSummary.from_flat(summary),
                        batches=[example_batch_record()])
    assert is_complete(run_dir) and sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["qps=1"]
    table = pq.read_table(run_dir / "requests.parquet")
    assert table.schema == REQUESTS_SCHEMA
    assert summarize(table.to_pandas()) == summarize(requests_frame(rows))
    assert json.loads((run_dir / "summary.json").read_text())["median_ttft_ms"] == pytest.approx(100)
    assert (run_dir / "config.yaml").read_text() == "qps: 1\n"
    assert pq.read_table(run_dir / "batches.parquet").num_rows == 1

    (tmp_path / "exp" / "incomplete").mkdir()  # a run that crashed before its summary
    (tmp_path / "exp" / ".qps=2.tmp-123").mkdir()  # one still being written
    write_run(tmp_path / "exp", "qps=3", config="a: 1\n", requests=[], summary=RunSummary.from_flat({"run_id": "qps=3", "qps": 3}))
    table = rebuild_experiment_summary(tmp_path / "exp")
    assert table["run_id"].tolist() == ["qps=1", "qps=3"]
    assert pd.read_parquet(tmp_path / "exp" / "summary.parquet")["workload"].tolist()[0] == '{"kind": "fixed"}'


def test_write_run_leaves_nothing_behind_on_failure(tmp_path):
    with pytest.raises(Exception, match="Expected bytes"):  # request_id must be a string
        write_run(tmp_path, "bad", config={}, requests=[dataclasses.replace(example_rows()[0], request_id=1)],
                  summary={})
    assert list(tmp_path.iterdir()) == []


def queue_rows(rate: float, service_s: float, n: int, prompt: int = 10) -> list[RequestRecord]:
    """Requests every 1 / rate s into one FIFO server taking service_s each (its first token 0.01 s in):
    a server that keeps pace when rate * service_s < 1, and falls behind otherwise."""
    rows, free = [], 0.0
    for i in range(n):
        arrival = i / rate
        start = max(arrival, free)
        free = start + service_s
        rows.append(row(f"r{i}", arrival, arrival, [start + 0.01, free], prompt=prompt))
    return rows


def test_pace_summary_sees_a_server_fall_behind_and_one_keep_pace():
    from stallfree.engine.records.request_metrics import UnloadedTtft

    unloaded = UnloadedTtft(intercept_ms=10.0 - 0.5 * 10, per_prompt_token_ms=0.5)  # 10 ms at 10 tokens
    kept = summarize(requests_frame(queue_rows(rate=5.0, service_s=0.1, n=100)), unloaded_ttft=unloaded)
    assert kept["completion_ratio"] == pytest.approx(1.0, abs=0.02) and kept["peak_in_flight"] == 1
    assert kept["median_client_scheduling_delay_ms"] == pytest.approx(0.0, abs=1e-6)
    assert kept["client_scheduling_delay_growth_ms"] == pytest.approx(0.0, abs=1e-6)
    assert kept["arrival_window_s"] == pytest.approx(99 / 5.0)
    behind = summarize(requests_frame(queue_rows(rate=10.0, service_s=0.2, n=100)), unloaded_ttft=unloaded)
    assert behind["completion_ratio"] == pytest.approx(0.5, abs=0.02)  # served 5 / s of the 10 / s offered
    assert behind["peak_in_flight"] > 40 and behind["client_scheduling_delay_growth_ms"] > 2000
    assert summarize(requests_frame(queue_rows(5.0, 0.1, 10)))["median_client_scheduling_delay_ms"] is None


def test_a_burst_absorbed_at_once_finishing_together_keeps_the_completion_ratio_at_most_1():
    # 100 requests sent over 10 s, all taken into one batch and finishing within 0.5 s of each other at the
    # end: rating the finishes by their own span would read 16x the offered rate.
    rows = [row(f"r{i}", i / 10, i / 10, [10.0 + i / 200, 10.5 + i / 200]) for i in range(100)]
    summary = summarize(requests_frame(rows))
    assert summary["completion_ratio"] is not None and summary["completion_ratio"] <= 1.0
    failed = [row(f"f{i}", i / 10, i / 10, [i / 10 + 0.05, i / 10 + 0.1], status="error" if i % 2 else "ok")
              for i in range(100)]
    assert summarize(requests_frame(failed))["completion_ratio"] == pytest.approx(0.5, abs=0.03)


def test_a_server_that_keeps_pace_with_widely_spread_latencies_reads_a_completion_ratio_near_1():
    # one request a second, each served on its own (no queue) in 1 to 41 s: the server keeps pace, though a
    # long request sent late in the steady window ends well after the window shifted by the median latency
    latencies = np.random.default_rng(0).uniform(1.0, 41.0, 120)
    rows = [row(f"r{i}", float(i), float(i), [i + 0.5, i + float(latency)]) for i, latency in enumerate(latencies)]
    assert summarize(requests_frame(rows))["completion_ratio"] >= 0.95
    # the same latencies behind one FIFO server at 0.5 s a request keep pace too; at 2 s a request it serves
    # half the offered rate
    assert summarize(requests_frame(queue_rows(rate=1.0, service_s=0.5, n=120)))["completion_ratio"] >= 0.95
    assert summarize(requests_frame(queue_rows(rate=1.0, service_s=2.0, n=120)))["completion_ratio"] \
        == pytest.approx(0.5, abs=0.03)


def test_a_burst_of_arrivals_at_the_end_of_the_steady_window_is_not_read_as_falling_behind():
    # one request a second, served on its own in 7 s, but 16 arrive within the window's last 5 s and take
    # 11 s: the server keeps pace; one median shift for both edges read 0.88, their late finishes missing
    sends = [float(i) for i in range(50)] + [50 + i * 5 / 16 for i in range(16)] + [55.0 + i for i in range(10)]
    rows = [row(f"r{i}", t, t, [t + 0.5, t + (11.0 if 50 <= t < 55 else 7.0)]) for i, t in enumerate(sends)]
    assert summarize(requests_frame(rows))["completion_ratio"] >= 0.95
