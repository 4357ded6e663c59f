"""Rate ramps: the arrival process's rate follows the ramp in time (time-rescaled), its rules are config errors
naming the key, and the client sends at the ramp's rate window by window."""
import numpy as np
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.workload.ramp import RampUp
from stallfree.loadgen.workload.request_specs import build_workload

LENGTHS = {"kind": "fixed", "prompt": 4, "output": 1}


def offsets(arrival: dict, n: int, seed: int = 0) -> np.ndarray:
    return np.array([s.send_offset_s for s in build_workload(arrival, LENGTHS, n, seed, 1000)])


def windowed_rates(times: np.ndarray, ramp: RampUp, n: int, windows: int):
    """(sends per second, the ramp's expected rate) in equal windows over the ramp's span."""
    edges = np.linspace(0.0, ramp.span_s(n), windows + 1)
    counts = np.histogram(times, edges)[0]
    expected = np.diff(ramp.expected_count(edges, n))
    return counts, expected


@pytest.mark.parametrize("strategy, start, end", [("linear", 2.0, 20.0), ("linear", 0.0, 10.0),
                                                  ("exponential", 1.0, 32.0)])
@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_the_rate_follows_the_ramp_in_time(kind, strategy, start, end):
    n = 20_000
    ramp = RampUp(strategy, start, end)
    times = offsets({"kind": kind, "qps": 99.0, "ramp_up_strategy": strategy, "ramp_up_start_qps": start,
                     "ramp_up_end_qps": end}, n)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    counts, expected = windowed_rates(times, ramp, n, windows=8)
    tolerance = 0.01 if kind == "constant" else 0.1  # a random process's count in a window spreads
    assert counts == pytest.approx(expected, rel=tolerance, abs=2)
    assert times[-1] == pytest.approx(ramp.span_s(n), rel=0.05)


def test_a_flat_ramp_is_the_process_at_that_rate():
    flat = offsets({"kind": "constant", "qps": 1.0, "ramp_up_strategy": "linear", "ramp_up_start_qps": 4.0,
                    "ramp_up_end_qps": 4.0}, 50)
    assert flat == pytest.approx(offsets({"kind": "constant", "qps": 4.0}, 50))
    same_draw = offsets({"kind": "poisson", "qps": 1.0, "ramp_up_strategy": "exponential", "ramp_up_start_qps": 3.0,
                         "ramp_up_end_qps": 3.0}, 50)
    assert same_draw == pytest.approx(offsets({"kind": "poisson", "qps": 3.0}, 50))


def test_warp_inverts_the_expected_count():
    for ramp in (RampUp("linear", 1.0, 7.0), RampUp("exponential", 0.5, 40.0)):
        u = np.linspace(0.0, 300.0, 601)  # past the span of 201 requests: the end rate goes on
        assert ramp.expected_count(ramp.warp(u, 201), 201) == pytest.approx(u, abs=1e-9)
        assert ramp.rate(np.array([0.0, ramp.span_s(201), 1e9]), 201) == pytest.approx([ramp.start_qps,
                                                                                      ramp.end_qps, ramp.end_qps])


@pytest.mark.parametrize("arrival, message", [
    ({"ramp_up_strategy": "linear", "ramp_up_start_qps": 8, "ramp_up_end_qps": 2},
     "arrival.ramp_up_end_qps must be > 0 and >= arrival.ramp_up_start_qps=8 (a ramp up), got 2"),
    ({"ramp_up_strategy": "exponential", "ramp_up_start_qps": 0, "ramp_up_end_qps": 2},
     "arrival.ramp_up_start_qps must be > 0 for an exponential ramp"),
    ({"ramp_up_strategy": "sideways", "ramp_up_start_qps": 1, "ramp_up_end_qps": 2},
     "arrival.ramp_up_strategy must be one of"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_qps": 1}, "arrival.ramp_up_end_qps must be set with"),
    ({"ramp_up_end_qps": 4}, "arrival.ramp_up_end_qps must be unset without arrival.ramp_up_strategy"),
])
def test_bad_ramps_name_the_key(arrival, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        offsets({"kind": "poisson", "qps": 1.0, **arrival}, 10)


def test_a_ramp_needs_a_rate_driven_process():
    with pytest.raises(ConfigError, match="arrival.ramp_up_strategy must be null unless"):
        offsets({"kind": "burst", "ramp_up_strategy": "linear", "ramp_up_start_qps": 1, "ramp_up_end_qps": 2}, 10)


def test_the_client_sends_at_the_ramps_rate_window_by_window():
    """Against a fake server: the actual sends per 1-second window of a 20 -> 100 QPS linear ramp within 5%."""
    from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
    from tests.helpers.fakes.fake_sse_server import running_fake_server

    n, ramp = 300, RampUp("linear", 20.0, 100.0)
    specs = build_workload({"kind": "constant", "qps": 1.0, "ramp_up_strategy": "linear", "ramp_up_start_qps": 20.0,
                            "ramp_up_end_qps": 100.0}, LENGTHS, n, 0, 1000)
    with running_fake_server(ttft_ms=20.0, tbt_ms=1.0) as url:
        records = run_open_loop_sync(url, specs, model="fake", timeout_s=10)
    assert all(r.status == "ok" for r in records)
    start = min(r.intended_send_time for r in records)
    sends = np.array([r.send_time - start for r in records])
    windows = int(ramp.span_s(n))  # whole seconds within the span
    edges = np.arange(windows + 1, dtype=float)
    counts, expected = np.histogram(sends, edges)[0], np.diff(ramp.expected_count(edges, n))
    assert counts == pytest.approx(expected, rel=0.05)
