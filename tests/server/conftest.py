"""Servers shared by the server tests: one in-process server per configuration (package-scoped), tiny
preset in float32."""
from __future__ import annotations

import httpx
import pytest

from stallfree.engine import LLM
from stallfree.engine.server import ServerConfig, start_server
from tests.fakes.poisoned_runner import PoisonedRunner

ENGINE = {"model": "tiny", "dtype": "float32", "scheduler": "sarathi", "chunk_size": 512, "num_blocks": 2048}
PROMPT = "the quick brown fox jumps over the lazy dog"
# GPT-2 byte-level alphabet: the token of each single byte
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_OTHERS = [b for b in range(256) if b not in _PRINTABLE]
BYTE_CHARS = {b: chr(b) for b in _PRINTABLE} | {b: chr(256 + i) for i, b in enumerate(_OTHERS)}


@pytest.fixture(scope="package")
def server():
    with start_server(ENGINE) as handle:
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
    tests/fakes/poisoned_runner.py): the engine must end only those requests."""
    with start_server(ENGINE) as handle:
        engine = handle.state.engine_loop.engine
        engine.runner = PoisonedRunner(engine.runner)  # before any request: the engine thread is idle
        yield handle


@pytest.fixture(scope="package")
def llm():
    return LLM(**ENGINE)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
        yield client

