"""Two "nodes" on one machine through the multi-node environment: node 0 runs the engine (rank 0), node 1
runs ``python -m stallfree.engine.distributed.node`` (rank 1); the node leaves with exit 0 on shutdown."""
import os
import socket
import subprocess
import sys

import pytest

from stallfree.engine import LLMEngine
from tests.helpers.engine import make_prompts, run_staggered


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_second_node_runs_rank_1(monkeypatch, no_orphans):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NNODES": "2"}
    node = subprocess.Popen([sys.executable, "-m", "stallfree.engine.distributed.node"],
                            env=os.environ | env | {"NODE_RANK": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        for key, value in (env | {"NODE_RANK": "0"}).items():
            monkeypatch.setenv(key, value)
        engine = LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu", tensor_parallel_size=2)
        assert engine.runner.workers.workers == []  # rank 1 is the other node's
        prompts = make_prompts(4, seed=1, max_len=40)
        got = run_staggered(engine, prompts, 8)
        engine.shutdown()
        assert node.wait(timeout=30) == 0, node.stderr.read()
    finally:
        node.kill()
        node.wait()
    for key in env:
        monkeypatch.delenv(key)
    single = LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu")
    assert got == run_staggered(single, prompts, 8)
