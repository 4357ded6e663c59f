"""``stallfree-serve ... parallel.tensor_parallel_size=2`` (and ``parallel.pipeline_parallel_size=2``): completions and
streams on two processes, and a worker killed mid-stream: the stream ends with an error naming it, the server
exits 1, no process remains."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers.server import sse_chunks

BODY = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"])
def test_parallel_server_answers_then_exits_1_when_a_worker_dies(parallel):
    exe = Path(sys.executable).with_name("stallfree-serve")
    proc = subprocess.Popen([str(exe), "tiny", "port=0", "model.dtype=float32", "model.device=cpu",
                             "cache.kv_memory_gib=0.01", parallel], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("stallfree-serve ready: "), line + proc.stderr.read()
        url = line.split()[2]
        ranks = [p for p in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(ranks) == 1  # rank 1; rank 0 is the server's own process
        completion = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60, trust_env=False).json()
        assert len(completion["choices"][0]["text"]) > 0 and completion["usage"]["completion_tokens"] == 16
        with httpx.stream("POST", f"{url}/v1/completions", json=BODY | {"stream": True}, timeout=60,
                          trust_env=False) as r:
            chunks, done = sse_chunks(r.iter_lines())
        assert done and "".join(c["choices"][0]["text"] for c in chunks) == completion["choices"][0]["text"]

        long = BODY | {"stream": True, "max_tokens": 1500}
        with httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=60, trust_env=False) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # it runs
            ranks[0].send_signal(signal.SIGKILL)
            chunks, _ = sse_chunks(lines)
        assert chunks[-1]["error"]["message"].endswith(f"worker rank 1 (pid {ranks[0].pid}) killed by SIGKILL")
        assert proc.wait(timeout=60) == 1
        assert "worker rank 1" in proc.stderr.read()
        assert not psutil.pid_exists(ranks[0].pid) or ranks[0].status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()
        proc.wait()
