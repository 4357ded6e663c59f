"""arrival.max_concurrency and the ramp keys: checked, carried by the presets, the old spelling
target.max_in_flight still taken with a hint, and run ids of runs without them unchanged."""
import pytest
from hydra import compose, initialize_config_dir

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.plan import plan_run


def bench_config(*overrides):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["model=tiny", *overrides]))


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_a_cap_below_one_names_the_key(value):
    with pytest.raises(ConfigError, match="arrival.max_concurrency must be an integer"):
        bench_config(f"arrival.max_concurrency={value}")


@pytest.mark.parametrize("arrival", sorted(p.stem for p in (CONF_DIR / "arrival").glob("*.yaml")))
def test_every_arrival_takes_a_cap(arrival):
    overrides = [f"arrival={arrival}", "arrival.max_concurrency=4"]
    assert bench_config(*overrides).arrival.max_concurrency == 4
    assert "max_concurrency" not in bench_config(*overrides).arrival.settings()


def test_the_concurrent_preset_is_a_closed_loop():
    cfg = bench_config("arrival=concurrent")
    assert cfg.arrival.settings() == {"kind": "burst"} and cfg.arrival.max_concurrency == 8


def test_the_old_spelling_still_caps_an_http_target(capsys):
    cfg = bench_config("target=http", "target.max_in_flight=3")
    assert cfg.arrival.max_concurrency == 3 and cfg.target.max_in_flight is None
    assert "target.max_in_flight=3 is arrival.max_concurrency=3 now" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="target.max_in_flight must be unset"):
        bench_config("target=http", "target.max_in_flight=3", "arrival.max_concurrency=4")


def test_locust_keeps_its_own_cap():
    with pytest.raises(ConfigError, match="arrival.max_concurrency must be null with target=locust"):
        bench_config("target=locust", "arrival.max_concurrency=2")


@pytest.mark.parametrize("overrides, run_id", [
    ([], "scheduler=sarathi,chunk_size=512,qps=1.0,cfg=775876b3"),
    (["arrival=gamma", "target=http"], "scheduler=sarathi,chunk_size=512,qps=1.0,cfg=e0f64a57"),
])
def test_runs_without_a_cap_keep_their_ids(overrides, run_id):
    """The ids these configs had before arrival.max_concurrency existed: their results are found again."""
    assert plan_run(bench_config(*overrides)).run_id == run_id
    assert plan_run(bench_config(*overrides, "arrival.max_concurrency=2")).run_id != run_id
    ramp = ["arrival.ramp_up_strategy=linear", "arrival.ramp_up_start_qps=1", "arrival.ramp_up_end_qps=4"]
    assert plan_run(bench_config(*overrides, *ramp)).run_id != run_id


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "constant"])
def test_rate_driven_presets_take_a_ramp(arrival):
    cfg = bench_config(f"arrival={arrival}", "arrival.ramp_up_strategy=exponential", "arrival.ramp_up_start_qps=1",
                       "arrival.ramp_up_end_qps=16")
    assert cfg.arrival.settings()["ramp_up_end_qps"] == 16


def test_a_capacity_search_sets_the_rate_itself():
    with pytest.raises(ConfigError, match="arrival.ramp_up_strategy must be null in mode=capacity"):
        bench_config("+experiment=capacity", "arrival.ramp_up_strategy=linear", "arrival.ramp_up_start_qps=1",
                     "arrival.ramp_up_end_qps=4")


def test_session_presets_on_every_target():
    from stallfree.loadgen.workload.sessions import SESSION_WORKLOADS

    for name in ("chat", "agentic"):
        for target in ("inprocess", "http", "locust"):
            cfg = bench_config(f"workload={name}", f"target={target}")
            assert cfg.workload.lengths["kind"] in SESSION_WORKLOADS


def test_an_arrival_rate_set_apart_names_the_run(capsys):
    cfg = bench_config("arrival.qps=6")
    assert cfg.qps == 6 and cfg.arrival.qps == 6
    assert plan_run(cfg).run_id == plan_run(bench_config("qps=6")).run_id
    assert "arrival.qps=6 sets qps" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="qps must be"):
        bench_config("arrival.qps=0")
