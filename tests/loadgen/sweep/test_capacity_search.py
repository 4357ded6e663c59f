"""Capacity search: bracketing + bisection on a synthetic pass/fail boundary, then a real cheap search."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallfree.loadgen.sweep.capacity_point import Point
from stallfree.loadgen.sweep.capacity_search import probes_left, search
from tests.helpers.fake_capacity import search_on

BIN = Path(sys.executable).parent


def synthetic(capacity: float, calls: list[float]):
    def measure(qps: float) -> Point:
        calls.append(qps)
        return Point(qps, qps <= capacity, None, None, 0)
    return measure


def assert_monotone(points: list[Point], lo: float | None, hi: float | None) -> None:
    passed = [p.qps for p in points if p.passed]
    failed = [p.qps for p in points if not p.passed]
    assert max(passed, default=0.0) == (lo or 0.0)
    assert min(failed, default=None) == hi
    if passed and failed:
        assert max(passed) < min(failed)


@pytest.mark.parametrize("capacity", [0.3, 1.0, 3.7, 11.0, 100.0])
def test_search_brackets_then_bisects_to_tolerance(capacity):
    calls: list[float] = []
    result = search(synthetic(capacity, calls), start_qps=1.0, min_qps=0.05, max_qps=256.0, tolerance=0.1)
    assert result.bracketed
    assert result.lo_qps <= capacity < result.hi_qps
    assert result.hi_qps - result.lo_qps <= 0.1 * result.lo_qps
    assert result.capacity_qps == result.lo_qps
    assert [p.qps for p in result.points] == calls and len(set(calls)) == len(calls)
    assert_monotone(result.points, result.lo_qps, result.hi_qps)


@pytest.mark.parametrize("capacity", [0.3, 3.7, 100.0, 1e9])
def test_probes_left_is_zero_at_the_end_and_covers_the_bisection(capacity):
    """The estimate behind a capacity search's ETA: at least one probe while the search goes on, none
    once it has stopped, and, from the bracket on, never fewer than it really makes."""
    bounds = {"min_qps": 0.05, "max_qps": 256.0, "tolerance": 0.1}
    points = search(synthetic(capacity, []), start_qps=1.0, **bounds).points
    assert probes_left([], **bounds) >= 2 and probes_left(points, **bounds) == 0
    for measured in range(1, len(points)):
        estimate = probes_left(points[:measured], **bounds)
        assert estimate >= 1
        if any(p.passed for p in points[:measured]) and not all(p.passed for p in points[:measured]):
            assert estimate >= len(points) - measured


def test_search_reports_unbracketed_bounds():
    everything = search(synthetic(1e9, []), start_qps=1.0, min_qps=0.1, max_qps=8.0, tolerance=0.1)
    assert (everything.capacity_qps, everything.lo_qps, everything.hi_qps) == (8.0, 8.0, None)
    assert [p.qps for p in everything.points] == [1.0, 2.0, 4.0, 8.0] and not everything.bracketed
    nothing = search(synthetic(0.0, []), start_qps=1.0, min_qps=0.2, max_qps=8.0, tolerance=0.1)
    assert (nothing.capacity_qps, nothing.lo_qps, nothing.hi_qps) == (0.0, None, 0.2)


@pytest.mark.slow
def test_capacity_search_on_tiny_inprocess(tmp_path):
    """One request at a time (max_num_seqs=1), evenly spaced arrivals: the queue, hence the P50
    scheduling delay, grows past the 50 ms bound once requests arrive faster than they are served
    (each takes 32 iterations, ~0.5 ms each here; a point lasts at least 0.5 s)."""
    args = ["scheduler=faster_transformer", "scheduler.max_num_seqs=1", "workload=fixed",
            "workload.lengths.prompt=32", "workload.lengths.output=32", "arrival=constant", "num_requests=16",
            "slo=strict", "slo.tbt_ms=60000", "capacity.start_qps=2", "capacity.min_qps=0.25",
            "capacity.max_qps=128", "capacity.tolerance=0.5", "capacity.max_p50_scheduling_delay_s=0.05",
            "capacity.min_duration_s=0.5", "capacity.max_requests=128",
            f"results_dir={tmp_path}"]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run([BIN / "stallfree-capacity", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    exp_dir = tmp_path / "capacity"
    [record] = json.loads((exp_dir / "capacity.json").read_text())
    assert (record["scheduler"], record["chunk_size"], record["max_num_seqs"], record["slo_name"],
            record["slo_tbt_ms"]) == ("faster_transformer", None, 1, "strict", 60000.0)
    points = [Point(**p) for p in record["points"]]
    assert record["bracketed"], points
    assert record["capacity_qps"] == record["lo_qps"] > 0
    assert record["hi_qps"] - record["lo_qps"] <= 0.5 * record["lo_qps"]
    assert_monotone(points, record["lo_qps"], record["hi_qps"])
    for p in points:  # every point is a complete run of the experiment
        summary = json.loads((exp_dir / p.run_id / "summary.json").read_text())
        assert summary["qps"] == p.qps and summary["capacity_search"] == "strict"
    assert "[capacity] faster_transformer" in done.stdout

    again = subprocess.run([BIN / "stallfree-capacity", *args], capture_output=True, text=True, env=env,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    # disturbed points (a busy machine) were measured twice: both runs are cached
    assert again.stdout.count("[cached]") >= len(points) and "[done]" not in again.stdout
    assert json.loads((exp_dir / "capacity.json").read_text()) == [record]


def test_repeated_search_reports_an_interval_and_reruns_disturbed_points(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from stallfree.engine.hydra_config import CONF_DIR
    from stallfree.engine.records.request_metrics import UnloadedTtft
    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.sweep import capacity_search as capacity

    capacities, calls, parts, slos = {0: 4.0, 1: 6.0}, [], [], []
    slo = {"slo_name": "strict", "slo_tbt_ms": 100.0, "decode_iter_ms": None}
    unloaded = UnloadedTtft(20.0, 0.1)

    def fake_run_point(cfg, targets, capacity_slo=None, rerun=False, part=None, slo=None, unloaded_ttft=None):
        calls.append((cfg.seed, cfg.qps, rerun))
        parts.append((cfg.seed, cfg.qps, part))
        slos.append((slo, unloaded_ttft, cfg.num_requests))
        passed = cfg.qps <= capacities[cfg.seed]
        return {"qps": cfg.qps, "run_id": f"s{cfg.seed}-q{cfg.qps}-r{rerun}", "completed": cfg.num_requests,
                "failed": 0, "p99_tbt_ms": 10.0 if passed else 1e6, "median_scheduling_delay_ms": 0.0,
                "completion_ratio": 1.0, "peak_in_flight": 1, "median_client_scheduling_delay_ms": 0.0,
                "client_scheduling_delay_growth_ms": 0.0, "disturbed": cfg.seed == 0 and cfg.qps == 2.0 and not rerun}

    monkeypatch.setattr(capacity, "run_point", fake_run_point)
    monkeypatch.setattr(capacity, "resolve_slo", lambda cfg, exp_dir, targets: slo)
    monkeypatch.setattr(capacity, "cached_unloaded_ttft", lambda cfg, exp_dir, targets: (unloaded, {"intercept_ms": 20.0}))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", ["+experiment=capacity", "repeats=2", "capacity.tolerance=0.05",
                                f"results_dir={tmp_path}"]))
    record = capacity.run_search(cfg, targets=None)
    assert [seed for seed, qps, rerun in calls if rerun] == [0] and (0, 2.0, True) in calls
    for seed, qps, part in parts:  # each probe's place in the job: its repeat's half, named by seed and qps
        assert part.extras == {"seed": seed, "qps": qps} and seed / 2 < part.done <= (seed + 1) / 2
    lo, hi = record["capacity_qps_repeats"]
    assert 3.8 <= lo <= 4.0 and 5.7 <= hi <= 6.0
    assert record["capacity_qps"] == pytest.approx((lo + hi) / 2)
    assert record["capacity_ci_lo"] < record["capacity_qps"] < record["capacity_ci_hi"]
    assert json.loads((tmp_path / "capacity" / "capacity.json").read_text()) == [record]
    # one SLO and one unloaded TTFT for every point; each point lasts >= min_duration_s (20 s by default)
    assert all(s is slo and u is unloaded for s, u, _ in slos)
    assert all(n == max(64, math.ceil(qps * 20)) for (_, qps, _), (_, _, n) in zip(calls, slos, strict=True))
    assert (record["capacity_bound"], record["capacity_display"]) == ("exact", f"{record['capacity_qps']:.3g} qps")


def test_a_steady_disturbance_is_measured_again_once_then_recorded(tmp_path, monkeypatch, capsys):
    """A server that takes every core beside its load generator disturbs every run: the search measures
    the first disturbed point again, sees it disturbed again, says so, and measures no later point twice."""
    calls = []

    def fake_run_point(cfg, targets, capacity_slo=None, rerun=False, part=None, slo=None, unloaded_ttft=None):
        calls.append((cfg.qps, rerun))
        passed = cfg.qps <= 3.0
        return {"qps": cfg.qps, "run_id": f"q{cfg.qps}-r{rerun}", "completed": cfg.num_requests, "failed": 0,
                "p99_tbt_ms": 10.0 if passed else 1e6, "median_scheduling_delay_ms": None,
                "completion_ratio": 1.0, "peak_in_flight": 1, "median_client_scheduling_delay_ms": 0.0,
                "client_scheduling_delay_growth_ms": 0.0, "disturbed": True,
                "disturbed_reason": "the load generator got 70% of the CPU it asked for"}

    record = search_on(monkeypatch, tmp_path, fake_run_point, ["capacity.tolerance=0.25"], unloaded_ms=20.0)
    assert [qps for qps, rerun in calls if rerun] == [1.0]  # the first point only
    assert "still disturbed (the load generator got 70% of the CPU it asked for): a steady disturbance" \
        in capsys.readouterr().out
    assert record["disturbed_points"] == len(record["points"]) > 2
    assert all(p["disturbed"] for p in record["points"]) and record["capacity_bound"] == "exact"


def test_a_point_too_short_for_its_concurrency_is_measured_again_longer(tmp_path, monkeypatch):
    sent = []

    def fake_run_point(cfg, targets, capacity_slo=None, rerun=False, part=None, slo=None, unloaded_ttft=None):
        sent.append((cfg.qps, cfg.num_requests))
        return {"qps": cfg.qps, "run_id": f"q{cfg.qps}-n{cfg.num_requests}", "completed": cfg.num_requests,
                "failed": 0, "p99_tbt_ms": 10.0, "median_scheduling_delay_ms": None, "completion_ratio": 1.0,
                "peak_in_flight": 50, "median_client_scheduling_delay_ms": 0.0,
                "client_scheduling_delay_growth_ms": 0.0}

    record = search_on(monkeypatch, tmp_path, fake_run_point, [
        "capacity.start_qps=4", "capacity.max_qps=8", "capacity.max_requests=256", "capacity.min_duration_s=20"])
    # 4 x 50 in flight = 200 requests: 4 qps measured again with 200; 8 qps (160) with twice as many, capped
    assert sent == [(4.0, 80), (4.0, 200), (8.0, 160), (8.0, 256)]
    assert [p["passed"] for p in record["points"]] == [True, True] and record["capacity_display"].startswith(">= 8")


def test_a_point_whose_in_flight_requests_grow_with_its_length_fails_as_a_backlog(tmp_path, monkeypatch):
    """A server falling behind keeps more requests in flight the longer the run: measured again longer, the
    point fails as a backlog instead of doubling its requests up to max_requests."""
    sent = []

    def fake_run_point(cfg, targets, capacity_slo=None, rerun=False, part=None, slo=None, unloaded_ttft=None):
        sent.append((cfg.qps, cfg.num_requests))
        peak = cfg.num_requests // 2 if cfg.qps > 2 else 2  # above 2 qps a queue builds with the run
        return {"qps": cfg.qps, "run_id": f"q{cfg.qps}-n{cfg.num_requests}", "completed": cfg.num_requests,
                "failed": 0, "p99_tbt_ms": 10.0, "median_scheduling_delay_ms": None, "completion_ratio": 1.0,
                "peak_in_flight": peak, "median_client_scheduling_delay_ms": 0.0,
                "client_scheduling_delay_growth_ms": 0.0}

    record = search_on(monkeypatch, tmp_path, fake_run_point, [
        "capacity.start_qps=2", "capacity.max_qps=8", "capacity.tolerance=1.0", "num_requests=16",
        "capacity.min_duration_s=8"])
    assert sent == [(2.0, 16), (4.0, 32), (4.0, 64)]  # 4 qps: 16 -> 32 in flight on a 2x longer run
    [passed, backlog] = record["points"]
    assert passed["passed"] and not backlog["passed"] and backlog["failed_rules"] == ["length", "backlog"]
    assert "peak in flight 16 -> 32 (2.0x) on a run twice as long or more: a queue that builds" in backlog["reason"]
    assert record["capacity_display"] == "2 qps"


def test_a_cached_capacity_point_without_the_keep_pace_fields_is_measured_again():
    from stallfree.engine.records.request_metrics import COMPLETION_METHOD
    from stallfree.loadgen.sweep.point import must_rerun

    assert must_rerun("none", {"capacity_search": "strict", "p99_tbt_ms": 10.0})  # an earlier version's point
    assert must_rerun("none", {"capacity_search": "strict", "completion_ratio": 1.0})  # counted another way
    assert not must_rerun("none", {"capacity_search": "strict", "completion_ratio": 1.0,
                                   "completion_method": COMPLETION_METHOD})
    assert must_rerun("none", {"capacity_search": None, "completion_ratio": 1.0})  # a plain run, counted another way
    assert not must_rerun("none", {"capacity_search": None, "p99_tbt_ms": 10.0})  # from before the keep-pace fields


def test_an_outdated_cached_capacity_point_is_measured_again_and_the_new_summary_kept(tmp_path):
    from hydra import compose, initialize_config_dir

    from stallfree.engine.hydra_config import CONF_DIR
    from stallfree.engine.records.request_metrics import COMPLETION_METHOD
    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.sweep.live_target import LiveTarget
    from stallfree.loadgen.sweep.plan import plan_run
    from stallfree.loadgen.sweep.point import run_point

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", ["model=tiny", "workload=fixed", "arrival=burst", "num_requests=3",
                                           "slo.tbt_ms=1000", "min_engine_cpu_share=0", f"results_dir={tmp_path}"]))
    targets = LiveTarget()
    try:
        first = run_point(cfg, targets, capacity_slo="relaxed")
        summary_path = plan_run(cfg, "relaxed").run_dir / "summary.json"
        outdated = {k: v for k, v in first.items() if k != "completion_method"}  # an earlier version's count
        summary_path.write_text(json.dumps({**outdated, "completion_ratio": 0.123}))
        again = run_point(cfg, targets, capacity_slo="relaxed")
    finally:
        targets.close()
    assert again["completion_method"] == COMPLETION_METHOD and again["completion_ratio"] != 0.123
    assert json.loads(summary_path.read_text())["completion_method"] == COMPLETION_METHOD
