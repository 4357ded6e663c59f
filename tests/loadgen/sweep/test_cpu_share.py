"""Disturbed-run detection (loadgen.sweep.cpu_share): the arithmetic on constructed samples, and a real
in-process replay starved by bounded CPU hogs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stallfree.loadgen.sweep.cpu_share import TICK_S, CpuMonitor, CpuSample, compare
from stallfree.loadgen.sweep.point import cpu_summary
from stallfree.loadgen.targets.inprocess import replay
from stallfree.loadgen.workload.request_specs import build_workload

HOG_S = 60  # each hog stops by itself after this long, whatever happens to the test


def _sample(wall: float, threads: dict, engine_cpu: float, ticks: list[int]) -> CpuSample:
    return CpuSample(wall, threads, engine_cpu, engine_cpu, ticks)


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
    assert report.engine_threads == 3 and report.engine_cpu_per_thread_wall == pytest.approx(9 / 30)
    assert report.others_cpu_share == pytest.approx((20 - 5 - 9) / 20)
    assert report.steal_share == pytest.approx(1 / 20)
    fine = compare(start, _sample(10.0, {1: (int(9e9), int(0.5e9))}, 9.0, ticks1), same_process=True)
    assert fine.engine_cpu_share == pytest.approx(9 / 9.5) and not fine.disturbed


def test_an_idle_engine_is_not_disturbed():
    start = _sample(0.0, {1: (5, 5)}, 0.0, [0] * 8)
    report = compare(start, _sample(1.0, {1: (5, 5)}, 0.0, [0, 0, 0, 100, 0, 0, 0, 0]), same_process=True)
    assert report.engine_cpu_share is None and not report.disturbed


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
