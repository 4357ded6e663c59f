"""engine/executor.py: the one factory choosing every runner, from the engine's config alone."""
import logging

import pytest

from stallfree.engine import EngineConfig, LLMEngine
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import COST_MODELS_DIR, cost_model_file
from stallfree.engine.runner.clock import VirtualClock, WallClock
from stallfree.engine.runner.model_runner import ModelRunner
from stallfree.engine.runner.serial import SerialRunner
from stallfree.engine.simulator.deployment import Deployment
from stallfree.engine.simulator.deployment_runner import DeploymentRunner
from stallfree.engine.simulator.simulated_runner import SimulatedRunner
from tests.helpers.engine import FIXED
from tests.helpers.fakes.operator_cost_model import fake_resolved


def test_the_model_runner_steps_serially_on_the_wall_clock():
    engine = LLMEngine.from_kwargs(model="tiny", device="cpu", dtype="float32")
    assert isinstance(engine.runner, ModelRunner) and isinstance(engine.batches, SerialRunner)
    assert isinstance(engine.clock, WallClock)


def test_a_simulated_runner_gets_the_cost_model_and_the_clock_named():
    engine = LLMEngine(EngineConfig.from_kwargs(model="tiny", runner="simulated", clock="virtual"), FIXED)
    assert isinstance(engine.runner, SimulatedRunner) and engine.runner.cost_model is FIXED
    assert isinstance(engine.batches, SerialRunner) and isinstance(engine.clock, VirtualClock)
    assert engine.runner.clock is engine.clock


def test_a_simulated_deployment_gets_its_runner_and_its_memory_plans_blocks(monkeypatch):
    monkeypatch.setattr(Deployment, "resolve", lambda self: fake_resolved())
    engine = LLMEngine.from_kwargs(model="fake-deployment", runner="simulated", clock="virtual",
                                   deployment={"gpu": "fake-gpu", "shape": "fake-1b", "pp": 2})
    assert isinstance(engine.runner, DeploymentRunner) and engine.batches is engine.runner
    assert engine.num_total_blocks == engine.simulation.memory.num_blocks


def test_a_simulated_runner_without_a_cost_model_names_the_key():
    with pytest.raises(ConfigError, match="^model.cost_model must be set for runner=simulated"):
        LLMEngine(EngineConfig.from_kwargs(model="tiny", runner="simulated"))


def test_tensor_parallel_simulated_is_refused_before_any_process_starts():
    config = EngineConfig.from_kwargs(model="tiny", runner="simulated", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="^parallel.tensor_parallel_size must be 1 for runner=simulated"):
        LLMEngine(config, FIXED)


def test_a_cost_model_under_its_old_folder_is_read_with_a_hint(caplog):
    with caplog.at_level(logging.WARNING, logger="stallfree.engine"):
        resolved = cost_model_file("engine/fitting/cost_models/small-cpu.json", "model.cost_model")
    assert resolved == str(COST_MODELS_DIR / "small-cpu.json")
    assert "engine/fitting/cost_models moved to engine/simulator/fitting/cost_models" in caplog.text


def test_an_unknown_cost_model_under_the_old_folder_is_still_an_error():
    with pytest.raises(ConfigError, match="model.cost_model must be a cost model JSON file"):
        cost_model_file("engine/fitting/cost_models/nope.json", "model.cost_model")
