"""The engine's identity in run ids: a field newer than the ids changes them only away from its default."""
from hydra import compose, initialize_config_dir

from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.config.views import engine_identity
from stallfree.loadgen.sweep.plan import plan_run


def config(*overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["model=tiny", *overrides]))


def test_prefix_caching_off_keeps_the_run_ids_measured_before_it():
    default, off = config(), config("cache.enable_prefix_caching=false")
    assert "enable_prefix_caching" not in engine_identity(default)["cache"]
    assert plan_run(default).run_dir == plan_run(off).run_dir
    on = config("cache.enable_prefix_caching=true")
    assert engine_identity(on)["cache"]["enable_prefix_caching"] is True
    assert plan_run(on).run_dir != plan_run(default).run_dir
