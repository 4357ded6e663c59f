"""Capacity searches against the FAKE SSE server (a url target): one that falls behind fails the keep-pace
rules, an unbracketed search says ">=", every point of a search is judged against one SLO, and a search too
short to be a load test is refused before it starts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fakes.fake_sse_server import running_fake_server

BIN = Path(sys.executable).parent
SHORT = ["workload=fixed", "workload.lengths.prompt=16", "workload.lengths.output=8", "num_requests=16",
         "capacity.min_duration_s=1", "capacity.max_requests=128"]


def capacity(url: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([BIN / "stallfree-capacity", "target=url", f"target.url={url}", "scheduler=sarathi",
                           *SHORT, *args, f"results_dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = json.loads((tmp_path / "capacity" / "capacity.json").read_text())
    return done, record


@pytest.mark.slow
def test_a_server_that_falls_behind_fails_the_keep_pace_rules(tmp_path):
    """Two requests at a time, ~55 ms each: about 36 requests/s. The 16-request burst of earlier versions
    passed any rate; here a point above the server's rate sees its completions lag and its queue grow."""
    with running_fake_server(ttft_ms=20, tbt_ms=5, max_running=2) as url:
        done, record = capacity(url, tmp_path, "slo=strict", "slo.tbt_ms=1000", "capacity.start_qps=8", "capacity.max_qps=128",
                                "capacity.tolerance=0.5")
    assert record["capacity_bound"] == "exact" and 8 <= record["capacity_qps"] < 50, record["points"]
    failing = [p for p in record["points"] if not p["passed"]]
    assert failing and all({"completion", "delay_growth", "length"} & set(p["failed_rules"]) for p in failing)
    assert all(p["num_requests"] >= p["qps"] * 1 for p in record["points"])  # each point lasts min_duration_s
    assert "fail - completion" in done.stdout


@pytest.mark.slow
def test_an_unbracketed_search_says_at_least_and_judges_every_point_by_one_slo(tmp_path):
    with running_fake_server(ttft_ms=20, tbt_ms=5) as url:
        done, record = capacity(url, tmp_path, "slo=relaxed", "num_requests=8", "capacity.start_qps=4",
                                "capacity.max_qps=8")
    assert (record["capacity_bound"], record["capacity_qps"]) == ("lower", 8.0), record["points"]
    assert record["capacity_display"] == ">= 8 qps (the highest rate tried)"
    assert ": >= 8 qps (the highest rate tried)" in done.stdout
    assert record["slo_reference_method"] == "probe" and record["slo_reference_measured_at"]
    assert 3 < record["decode_iter_ms"] < 10  # the fake's 5 ms token gap: the probe measured the target
    slo_keys = ("slo_tbt_ms", "decode_iter_ms", "slo_reference_measurements_ms", "slo_reference_measured_at")
    for point in record["points"]:
        summary = json.loads((tmp_path / "capacity" / point["run_id"] / "summary.json").read_text())
        assert {k: summary[k] for k in slo_keys} == {k: record[k] for k in slo_keys}
    assert record["unloaded_ttft"]["intercept_ms"] > 0 and set(record["unloaded_ttft"]["measurements_ms"]) == {"16"}


@pytest.mark.parametrize(("args", "key"), [
    (["capacity.max_qps=256", "capacity.min_duration_s=20", "capacity.max_requests=32"], "capacity.max_requests"),
    (["arrival=burst"], "arrival"),
    (["num_requests=5000"], "num_requests"),
])
def test_a_search_too_short_to_be_a_load_test_is_refused(tmp_path, args, key):
    done = subprocess.run([BIN / "stallfree-capacity", "scheduler=sarathi", "slo=strict", *args,
                           f"results_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"stallfree-bench: config error: {key} must be")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "capacity").exists()
