"""The bench's keys of a deployment split across processes: a study (which reshapes one engine's iterations)
refuses them in one line naming the key, and each deployment has run ids of its own."""
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.sweep.plan import plan_run
from tests.loadgen.config.test_arrival_keys import bench_config

SPLIT = [["parallel.data_parallel_size=2"], ["parallel.disaggregation=1p1d", "cache.enable_prefix_caching=true"]]


@pytest.mark.parametrize("split", SPLIT)
def test_a_study_refuses_a_split_deployment(split):
    with pytest.raises(ConfigError, match="mode must be other than 'study'"):
        bench_config("mode=study", *split)
    assert bench_config(*split).mode == "run"  # the same keys run in the default mode


def test_split_deployments_have_run_ids_of_their_own():
    ids = [plan_run(bench_config(*keys)).run_id for keys in [[], *SPLIT]]
    assert len(set(ids)) == 3
    assert plan_run(bench_config("parallel.router=round_robin", *SPLIT[0])).run_id != ids[1]
