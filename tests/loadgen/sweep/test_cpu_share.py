"""Disturbed-run detection and the load generator's share (loadgen.sweep.cpu_share): the arithmetic on
constructed samples, a real in-process replay starved by bounded CPU hogs, and the placement every
summary records."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.cpu_share import (
    TICK_S,
    CpuMonitor,
    CpuSample,
    compare,
    compare_client,
    placement,
)
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.point import cpu_summary, run_point
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload

HOG_S = 60  # each hog stops by itself after this long, whatever happens to the test


def _sample(wall: float, threads: dict, engine_cpu: float, ticks: list[int], own_cpu: float | None = None) -> CpuSample:
    return CpuSample(wall, threads, engine_cpu, engine_cpu if own_cpu is None else own_cpu, ticks)


def test_share_is_what_the_engine_ran_of_what_it_asked_for():
    ticks0 = [0] * 8
    # 10 s of 2 CPUs: 2000 ticks at 100 Hz; idle 500, steal 100
    total = round(20 / TICK_S)
    ticks1 = [total - round(6 / TICK_S), 0, 0, round(5 / TICK_S), 0, 0, 0, round(1 / TICK_S)]
    start = _sample(0.0, {1: (0, 0), 2: (0, 0)}, 0.0, ticks0)
    end = _sample(10.0, {1: (int(6e9), int(1e9)), 2: (int(2e9), int(1e9)), 3: (int(1e9), 0)}, 9.0, ticks1)
    report = compare(start, end, same_process=True)
    assert report.engine_cpu_share == pytest.approx(9 / 11)
    assert report.disturbed and report.engine_run_delay_s == pytest.approx(2.0)
    assert report.disturbed_reason == "the engine got 82% of the CPU it asked for"
    assert report.engine_threads == 3 and report.engine_cpu_per_thread_wall == pytest.approx(9 / 30)
    assert report.others_cpu_share == pytest.approx((20 - 5 - 9) / 20)
    assert report.steal_share == pytest.approx(1 / 20)
    assert report.loadgen_cpu_s is None and report.loadgen_cpu_share is None  # inside the engine's time
    fine = compare(start, _sample(10.0, {1: (int(9e9), int(0.5e9))}, 9.0, ticks1), same_process=True)
    assert fine.engine_cpu_share == pytest.approx(9 / 9.5) and not fine.disturbed


def test_a_load_generator_of_its_own_is_counted_apart_from_the_others():
    total = round(20 / TICK_S)  # 10 s of 2 CPUs, 5 s of them idle
    ticks1 = [total - round(5 / TICK_S), 0, 0, round(5 / TICK_S), 0, 0, 0, 0]
    start = _sample(0.0, {1: (0, 0)}, 0.0, [0] * 8, own_cpu=1.0)
    end = _sample(10.0, {1: (int(9e9), 0)}, 9.0, ticks1, own_cpu=3.0)
    report = compare(start, end, same_process=False)
    assert report.loadgen_cpu_s == pytest.approx(2.0) and report.loadgen_cpu_share == pytest.approx(2 / 20)
    assert report.others_cpu_share == pytest.approx((20 - 5 - 9 - 2) / 20)
    summary = cpu_summary(report, virtual_time=False, requests=40)
    assert summary["loadgen_cpu_ms_per_request"] == pytest.approx(50.0)
    assert cpu_summary(compare(start, end, same_process=True), False, 40)["loadgen_cpu_ms_per_request"] is None


def test_placement_records_each_sides_cpus_and_nice_value():
    cpus, nice = sorted(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0)
    here = placement(in_process=True, engine_pid=None)
    assert (here.cpu_placement, here.loadgen_cpus, here.engine_cpus) == ("inprocess", cpus, cpus)
    assert here.loadgen_nice == here.engine_nice == nice
    far = placement(in_process=False, engine_pid=None, client_nice=5)
    assert (far.cpu_placement, far.loadgen_nice, far.engine_cpus, far.engine_nice) == ("external", min(19, nice + 5),
                                                                                        None, None)
    assert placement(False, None, client_nice=19).loadgen_nice == 19  # the kernel's cap
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=lambda: os.nice(3))
    try:
        child = placement(in_process=False, engine_pid=server.pid)
        assert (child.cpu_placement, child.engine_cpus, child.engine_nice) == ("subprocess", cpus, min(19, nice + 3))
    finally:
        server.kill()
        server.wait()
    gone = placement(in_process=False, engine_pid=server.pid)
    assert gone.cpu_placement == "subprocess" and gone.engine_cpus is None and gone.engine_nice is None


def test_an_idle_engine_is_not_disturbed():
    start = _sample(0.0, {1: (5, 5)}, 0.0, [0] * 8)
    report = compare(start, _sample(1.0, {1: (5, 5)}, 0.0, [0, 0, 0, 100, 0, 0, 0, 0]), same_process=True)
    assert report.engine_cpu_share is None and not report.disturbed


def test_a_starved_load_generator_disturbs_a_run_on_a_server_elsewhere():
    """target=url: no engine here to watch; the load generator's own threads are (client side)."""
    total = round(20 / TICK_S)  # 10 s of 2 CPUs, 4 s of them idle
    ticks1 = [total - round(4 / TICK_S), 0, 0, round(4 / TICK_S), 0, 0, 0, 0]
    start = _sample(0.0, {1: (0, 0), 2: (0, 0)}, 0.0, [0] * 8, own_cpu=1.0)
    end = _sample(10.0, {1: (int(2e9), int(2e9)), 2: (int(1e9), 0)}, 0.0, ticks1, own_cpu=4.0)
    report = compare_client(start, end)
    assert report.loadgen_sched_share == pytest.approx(3 / 5) and report.disturbed
    assert report.disturbed_reason == "the load generator got 60% of the CPU it asked for"
    assert report.engine_cpu_share is None and report.engine_cpu_s is None and report.engine_threads is None
    assert report.loadgen_cpu_s == pytest.approx(3.0) and report.others_cpu_share == pytest.approx((20 - 4 - 3) / 20)
    summary = cpu_summary(report, virtual_time=False, requests=30)
    assert summary["disturbed"] and summary["disturbed_reason"] == report.disturbed_reason
    fed = compare_client(start, _sample(10.0, {1: (int(3e9), int(0.1e9))}, 0.0, ticks1, own_cpu=4.0))
    assert not fed.disturbed and fed.disturbed_reason is None
    with CpuMonitor(None, client_side=True) as monitor:
        sum(range(2_000_000))  # the load generator asks for a CPU
    assert monitor.report.loadgen_sched_share is not None and monitor.report.engine_cpu_share is None


def test_monitor_without_a_local_process_reports_nothing():
    with CpuMonitor(None) as monitor:
        pass
    assert monitor.report is None


@pytest.fixture(scope="module")
def tiny_engine():
    from stallfree.engine import LLMEngine

    return LLMEngine.from_kwargs(model="tiny", dtype="float32")


def _replay(engine) -> CpuMonitor:
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 32, "output": 24}, 8, 0, 1000)
    with CpuMonitor(os.getpid()) as monitor:
        records = replay(engine, specs).records
    assert all(r.status == "ok" for r in records)
    return monitor


def test_cpu_hogs_make_an_inprocess_run_disturbed(tiny_engine):
    _replay(tiny_engine)  # warm up
    hog = f"import time\nend = time.time() + {HOG_S}\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(3 * (os.cpu_count() or 1))]
    try:
        report = _replay(tiny_engine).report
    finally:
        for proc in hogs:
            proc.kill()
            proc.wait()
    assert report.disturbed, report
    assert report.engine_cpu_share < 0.9 and report.others_cpu_share > 0.3, report
    assert report.engine_run_delay_s > 0 and report.load_avg_1m >= 0


def test_a_virtual_clock_run_is_never_disturbed():
    """A simulated run on a virtual clock gives the same results whatever CPU it got: it keeps its CPU
    report but is not marked (so a capacity search does not measure it again)."""
    start = _sample(0.0, {1: (0, 0)}, 0.0, [0] * 8)
    starved = compare(start, _sample(10.0, {1: (int(1e9), int(9e9))}, 1.0, [100] * 8), same_process=True)
    assert starved.disturbed
    assert cpu_summary(starved, virtual_time=False)["disturbed"]
    virtual = cpu_summary(starved, virtual_time=True)
    assert virtual["disturbed"] is False and virtual["engine_cpu_share"] == pytest.approx(0.1)
    assert cpu_summary(None, virtual_time=True) == {"disturbed": None}


def test_a_runs_summary_says_how_the_cpu_was_shared(tmp_path):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        # 48 requests: 3 ran in 10 ms on the tiled linears, under one tick of the process's CPU clock (0.0 s)
        cfg = load_bench(compose("bench", ["model=tiny", "workload=fixed", "arrival=burst", "num_requests=48",
                                           "slo.tbt_ms=1000", "min_engine_cpu_share=0", f"results_dir={tmp_path}"]))
    targets = LiveTarget()
    try:
        summary = run_point(cfg, targets)
    finally:
        targets.close()
    assert summary["completed"] == 48 and summary["cpu_placement"] == "inprocess"
    assert summary["loadgen_cpus"] == summary["engine_cpus"] == sorted(os.sched_getaffinity(0))
    assert summary["loadgen_nice"] == summary["engine_nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert summary["loadgen_cpu_s"] is None and summary["loadgen_cpu_ms_per_request"] is None
    assert summary["engine_cpu_s"] > 0
