"""Servers shared by the server tests: one in-process server per configuration (package-scoped), tiny
preset in float32."""
from __future__ import annotations

import httpx
import pytest

from stallfree.engine import LLM
from stallfree.engine.server import ServerConfig, start_server
from tests.helpers.fakes.machine_limits import fake_machine_limits
from tests.helpers.fakes.poisoned_runner import PoisonedRunner
from tests.helpers.server import ENGINE


@pytest.fixture(scope="package")
def server():
    with fake_machine_limits(), start_server(ENGINE) as handle:
        yield handle


@pytest.fixture(scope="package")
def keyed_server():
    with start_server(ENGINE, ServerConfig(port=0, api_key="s3cret")) as handle:
        yield handle


@pytest.fixture(scope="package")
def small_queue_server():
    with start_server({**ENGINE, "max_num_seqs": 2}, ServerConfig(port=0, max_waiting=2)) as handle:
        yield handle


@pytest.fixture(scope="package")
def poisoned_server():
    """A server whose runner fails every step holding a request with seed POISON_SEED (the FAKE fault of
    tests/helpers/fakes/poisoned_runner.py): the engine must end only those requests."""
    with start_server(ENGINE) as handle:
        engine = handle.state.engine_loop.engine
        # The engine steps its runner through engine.batches (engine/runner/serial.py); before any request:
        # the engine thread is idle.
        engine.batches.runner = PoisonedRunner(engine.batches.runner)
        yield handle


@pytest.fixture(scope="package")
def llm():
    return LLM(**ENGINE)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
        yield client

