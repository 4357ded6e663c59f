"""The memory planner: KV blocks = GPU memory x utilisation - weights / (TP x PP) - activation reserve, per GPU."""
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.simulator.deployment import Deployment
from stallfree.engine.simulator.memory_plan import GIB, plan_memory
from tests.helpers.fakes.operator_cost_model import FakeGPU, FakeShape

SHAPE = FakeShape()  # 2 GiB of weights; 8 layers, 4 KV heads of 128


def deployment(**kwargs) -> Deployment:
    return Deployment(gpu="fake-gpu", shape="fake-1b", activation_reserve_gib=1.0, **kwargs)


def test_one_gpu_by_hand():
    plan = plan_memory(deployment(), SHAPE, FakeGPU(memory_gib=10.0), block_size=16)
    block = 2 * 8 * 4 * 128 * 16 * 2  # K and V, 8 layers, 4 KV heads x 128, 16 tokens, 2 bytes
    assert plan.kv_bytes_per_block == block == 262144
    assert plan.usable_gib == pytest.approx(9.0) and plan.weights_gib == pytest.approx(2.0)
    assert plan.num_blocks == int((9.0 - 2.0 - 1.0) * GIB // block) == 24576


def test_tensor_and_pipeline_parallelism_split_weights_and_kv():
    one = plan_memory(deployment(), SHAPE, FakeGPU(), 16)
    tp2 = plan_memory(deployment(tp=2), SHAPE, FakeGPU(), 16)
    tp2_pp2 = plan_memory(deployment(tp=2, pp=2), SHAPE, FakeGPU(), 16)
    assert tp2.weights_gib == pytest.approx(1.0) and tp2_pp2.weights_gib == pytest.approx(0.5)
    assert tp2.kv_bytes_per_block == one.kv_bytes_per_block // 2  # half the KV heads per GPU
    assert tp2_pp2.kv_bytes_per_block == one.kv_bytes_per_block // 4  # and half the layers
    assert tp2_pp2.num_blocks == int((9.0 - 0.5 - 1.0) * GIB // tp2_pp2.kv_bytes_per_block)


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    eight = plan_memory(deployment(tp=8), SHAPE, FakeGPU(), 16)  # 4 KV heads over 8 GPUs: one each
    assert eight.kv_bytes_per_block == 2 * 8 * 1 * 128 * 16 * 2


def test_uneven_stages_size_the_cache_by_the_deepest_stage():
    plan = plan_memory(deployment(pp=3), SHAPE, FakeGPU(), 16)  # 8 layers: 3, 3, 2
    assert plan.kv_bytes_per_block == 2 * 3 * 4 * 128 * 16 * 2


def test_utilisation_and_the_estimated_reserve():
    half = plan_memory(Deployment(gpu="g", shape="s", gpu_memory_utilization=0.5, activation_reserve_gib=0.0),
                       SHAPE, FakeGPU(), 16)
    assert half.kv_cache_gib == pytest.approx(5.0 - 2.0)
    estimated = plan_memory(Deployment(gpu="g", shape="s"), SHAPE, FakeGPU(), 16)
    assert 1.0 < estimated.activation_reserve_gib < 2.0  # CUDA context + a 4096-token forward pass


def test_a_model_that_does_not_fit_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.deployment: fake-1b does not fit on 1 x fake-gpu"):
        plan_memory(deployment(), SHAPE, FakeGPU(memory_gib=3.0), 16)
