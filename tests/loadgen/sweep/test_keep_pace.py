"""The rules a capacity point passes (loadgen.sweep.keep_pace): each one can fail a point alone, and the
server-side rule applies only where the target reports the field."""
import pytest
from hydra import compose, initialize_config_dir

from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.capacity_point import point_from_summary

KEPT_PACE = {"qps": 2.0, "run_id": "r", "completed": 100, "failed": 0, "p99_tbt_ms": 50.0,
             "median_scheduling_delay_ms": 100.0, "completion_ratio": 0.98, "peak_in_flight": 5,
             "median_client_scheduling_delay_ms": 120.0, "client_scheduling_delay_growth_ms": 30.0}


@pytest.fixture(scope="module")
def capacity():
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["+experiment=capacity"])).capacity


def test_a_point_that_kept_pace_within_the_slo_passes_with_every_rule_in_its_reason(capacity):
    point = point_from_summary(KEPT_PACE, slo_tbt_ms=60.0, capacity=capacity)
    assert point.passed and point.failed_rules == [] and point.num_requests == 100
    assert "completion 0.98x offered >= 0.9" in point.reason and "p50 server delay" in point.reason


@pytest.mark.parametrize(("change", "rule"), [
    ({"failed": 1}, "failed"),
    ({"p99_tbt_ms": 70.0}, "tbt"),
    ({"p99_tbt_ms": None}, "tbt"),
    ({"completion_ratio": 0.6}, "completion"),
    ({"completion_ratio": None}, "completion"),  # no steady window: nothing shows it kept pace
    ({"median_client_scheduling_delay_ms": 2500.0}, "client_delay"),
    ({"client_scheduling_delay_growth_ms": 1500.0}, "delay_growth"),
    ({"peak_in_flight": 30}, "length"),  # 100 requests, 30 in flight at once: a burst
    ({"median_scheduling_delay_ms": 2500.0}, "server_delay"),
])
def test_each_rule_fails_a_point_alone_and_names_itself(capacity, change, rule):
    point = point_from_summary({**KEPT_PACE, **change}, slo_tbt_ms=60.0, capacity=capacity)
    assert not point.passed and point.failed_rules == [rule], point.reason


def test_a_target_without_server_timings_is_judged_by_the_client_side_rules(capacity):
    summary = {**KEPT_PACE, "median_scheduling_delay_ms": None}
    assert point_from_summary(summary, 60.0, capacity).passed
    assert not point_from_summary({**summary, "completion_ratio": 0.5}, 60.0, capacity).passed
