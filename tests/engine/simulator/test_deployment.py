"""Deployments as configuration, and how a deployment's stages compose the operator cost model's times."""
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import compose
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput
from stallfree.engine.simulator.deployment import Deployment
from stallfree.engine.simulator.deployment_runner import DeploymentRunner
from tests.helpers.fakes import operator_cost_model as fake
from tests.helpers.fakes.operator_cost_model import FakeShape, fake_resolved

PRESETS = ("mistral7b_a100", "yi34b_a100_tp2", "llama2_70b_a40_tp4_pp2", "falcon180b_a100_tp4_pp2",
           "falcon180b_a100_tp8", "llama3_8b_h100")


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_compose_into_deployments(preset):
    model = compose("bench", [f"model={preset}"], "test")["model"]
    d = Deployment.from_config(model["deployment"])
    assert model["model"] == preset and model["runner"] == "simulated" and model["clock"] == "virtual"
    assert (d.tp, d.pp) == {"yi34b_a100_tp2": (2, 1), "llama2_70b_a40_tp4_pp2": (4, 2),
                            "falcon180b_a100_tp4_pp2": (4, 2), "falcon180b_a100_tp8": (8, 1)}.get(preset, (1, 1))
    assert d.gpu_memory_utilization == 0.9 and d.max_batch_size == 128


@pytest.mark.parametrize("values, message", [
    ({"gpu": "a100"}, "model.deployment.shape must be a non-empty string, got None"),
    ({"gpu": "a100", "shape": "x", "tp": 0}, "model.deployment.tp must be an integer >= 1, got 0"),
    ({"gpu": "a100", "shape": "x", "gpu_memory_utilization": 1.5},
     "model.deployment.gpu_memory_utilization must be a number in (0, 1], got 1.5"),
    ({"gpu": "a100", "shape": "x", "pp_size": 2}, "model.deployment.pp_size is not a deployment setting"),
])
def test_bad_settings_name_their_key(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Deployment.from_config(values)


def test_layers_are_split_evenly_over_the_stages():
    assert Deployment("g", "s", pp=2).stage_layers(80) == (40, 40)
    assert Deployment("g", "s", pp=4).stage_layers(30) == (8, 8, 7, 7)
    with pytest.raises(ConfigError, match="model.deployment.pp must be at most the model's 2 layers"):
        Deployment("g", "s", pp=4).stage_layers(2)


def output(prefill: int, decodes: int) -> SchedulerOutput:
    params = SamplingParams()
    units = [ScheduledUnit(f"d{i}", [1], 100, False, True, [0], params) for i in range(decodes)]
    units.append(ScheduledUnit("p", [1] * prefill, 0, True, True, [0], params))
    return SchedulerOutput(units)


def test_stage_times_compose_layers_embedding_head_overhead_and_send():
    """8 layers over 2 stages: each stage its 4 layers; the first also the embedding and the iteration's CPU
    overhead, the last the LM head; the send crosses the stage boundary."""
    clock = VirtualClock()
    runner = DeploymentRunner(Deployment("g", "s", tp=2, pp=2), fake_resolved(FakeShape(num_layers=8)), seed=0,
                              clock=clock)
    tokens = 100 + 3
    layer = fake.LAYER_FIXED_S + fake.LAYER_PER_TOKEN_S * tokens
    stages, send = runner.stage_seconds(output(prefill=100, decodes=3))
    assert stages == pytest.approx([4 * layer + fake.EMBEDDING_S + fake.CPU_OVERHEAD_S, 4 * layer + fake.LM_HEAD_S])
    assert send == pytest.approx(fake.SEND_PER_TOKEN_S * tokens)
    runner.submit(output(prefill=100, decodes=3), now=1.0)
    assert clock() == pytest.approx(1.0 + stages[0])  # stage 0 takes the next micro-batch then
    assert runner.pop_finished(clock()) == [] and runner.wait()
    [finished] = runner.pop_finished(clock())
    assert finished.end_s == clock() == pytest.approx(1.0 + sum(stages) + send)
    assert finished.result.stage_busy_s == pytest.approx(stages) and not runner.wait()


def test_one_stage_is_the_whole_model_and_sends_nothing():
    runner = DeploymentRunner(Deployment("g", "s"), fake_resolved(FakeShape(num_layers=8)), seed=0,
                              clock=VirtualClock())
    stages, send = runner.stage_seconds(output(prefill=10, decodes=0))
    layer = fake.LAYER_FIXED_S + fake.LAYER_PER_TOKEN_S * 10
    assert stages == pytest.approx([8 * layer + fake.EMBEDDING_S + fake.LM_HEAD_S + fake.CPU_OVERHEAD_S])
    assert send == 0.0


def test_middle_stages_of_equal_depth_are_costed_once():
    resolved = fake_resolved(FakeShape(num_layers=16))
    runner = DeploymentRunner(Deployment("g", "s", pp=4), resolved, seed=0, clock=VirtualClock())
    runner.stage_seconds(output(prefill=10, decodes=0))
    assert resolved.cost_model.stage_calls == [(10, 4, True, False), (10, 4, False, False), (10, 4, False, True)]
