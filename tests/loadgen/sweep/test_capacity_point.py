"""loadgen/sweep/capacity_point.py: how sure a point's P99 TBT verdict is, and the search measuring a point again,
longer, while an unsure P99 TBT decides it (fake run_point; the fake-server case is in
test_capacity_on_fake_server.py)."""
import pytest

from stallfree.loadgen.sweep.capacity_point import tbt_verdict_sure
from tests.helpers.fake_capacity import search_on


@pytest.mark.parametrize("low, high, sure", [
    (40.0, 90.0, True),  # the whole interval under the 100 ms SLO: a pass another draw keeps
    (120.0, None, True),  # above it: a fail however few the gaps
    (80.0, 130.0, False),  # straddling it: another draw could flip the verdict
    (80.0, None, False),  # too few gaps for an upper bound: the pass is not sure
    (None, None, None),  # no gaps
])
def test_a_tbt_verdict_is_sure_only_when_its_p99_interval_lies_on_one_side_of_the_slo(low, high, sure):
    assert tbt_verdict_sure(low, high, 100.0) is sure


ONE_POINT = ["capacity.start_qps=4", "capacity.min_qps=4", "capacity.max_qps=4"]  # 80 requests at 4 qps


def interval_run_point(sent: list, intervals: dict[int, tuple], completion: float = 1.0):
    """A fake run_point whose P99 TBT and its 95% interval depend on the point's requests:
    ``intervals[num_requests] = (p99, low, high)`` against the 100 ms SLO."""
    def fake_run_point(cfg, targets, capacity_slo=None, rerun=False, part=None, slo=None, unloaded_ttft=None):
        sent.append(cfg.num_requests)
        p99, low, high = intervals[cfg.num_requests]
        return {"qps": cfg.qps, "run_id": f"q{cfg.qps}-n{cfg.num_requests}", "completed": cfg.num_requests,
                "failed": 0, "p99_tbt_ms": p99, "median_scheduling_delay_ms": None, "completion_ratio": completion,
                "peak_in_flight": 2, "median_client_scheduling_delay_ms": 0.0,
                "client_scheduling_delay_growth_ms": 0.0, "tbt_gaps": 10 * cfg.num_requests,
                "tbt_requests": cfg.num_requests, "tbt_prefill_gaps": cfg.num_requests,
                "p99_tbt_low_ms": low, "p99_tbt_high_ms": high}
    return fake_run_point


def test_a_lucky_pass_on_an_unsure_p99_is_measured_again_and_decided_by_the_longer_run(tmp_path, monkeypatch,
                                                                                         capsys):
    sent = []
    record = search_on(monkeypatch, tmp_path, interval_run_point(sent, {
        80: (90.0, 20.0, None),  # a pass on too few gaps for an upper bound
        160: (140.0, 110.0, 300.0)}), ONE_POINT)  # the longer run: surely above the SLO
    assert sent == [80, 160]
    [point] = record["points"]
    assert (point["passed"], point["num_requests"], point["tbt_verdict_sure"]) == (False, 160, True)
    assert point["unsure_remeasured"] == 1 and record["unsure_tbt_points"] == 0
    assert (point["tbt_gaps"], point["tbt_requests"], point["tbt_prefill_gaps"]) == (1600, 160, 160)  # its evidence
    assert record["capacity_display"].startswith("<")
    assert ("qps 4: 80 requests, P99 TBT 90 ms, its 95% interval [20, ?] ms straddles the SLO 100 ms: measuring "
            "again with 160") in capsys.readouterr().out


def test_a_point_still_unsure_after_its_remeasures_decides_and_says_so(tmp_path, monkeypatch, capsys):
    sent = []
    unsure = (95.0, 60.0, 130.0)
    record = search_on(monkeypatch, tmp_path, interval_run_point(sent, {80: unsure, 160: unsure, 320: unsure}),
                       [*ONE_POINT, "capacity.unsure_remeasures=2"])
    assert sent == [80, 160, 320]
    [point] = record["points"]
    assert point["passed"] and point["tbt_verdict_sure"] is False and point["unsure_remeasured"] == 2
    assert record["unsure_tbt_points"] == 1
    assert "(1 decided on an unsure P99 TBT)" in capsys.readouterr().out


@pytest.mark.parametrize(("overrides", "completion"), [
    (["capacity.unsure_remeasures=0"], 1.0),  # never
    ([], 0.5),  # the completion rule fails however the TBT draw falls
    (["capacity.max_requests=80"], 1.0),  # no more requests to send
])
def test_an_unsure_p99_that_cannot_or_need_not_be_measured_again(tmp_path, monkeypatch, overrides, completion):
    sent = []
    search_on(monkeypatch, tmp_path, interval_run_point(sent, {80: (95.0, 60.0, None)}, completion),
              [*ONE_POINT, *overrides])
    assert sent == [80]


def test_unsure_remeasures_below_zero_names_the_key():
    from hydra import compose, initialize_config_dir

    from stallfree.engine.config_checks import ConfigError
    from stallfree.engine.hydra_config import CONF_DIR
    from stallfree.loadgen.config.schema import load_bench

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"), \
            pytest.raises(ConfigError, match="capacity.unsure_remeasures must be an integer >= 0"):
        load_bench(compose("bench", ["+experiment=capacity", "capacity.unsure_remeasures=-1"]))
