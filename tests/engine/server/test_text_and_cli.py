"""Incremental detokenization, stop-string hold-back, and the stallfree-serve command line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from stallfree.engine.server import main
from stallfree.engine.server.text import IncrementalDetokenizer, StopStringFilter
from tests.helpers.server import BYTE_CHARS


def test_incremental_detokenizer_holds_partial_utf8(llm):
    tok = llm.engine.tokenizer
    byte_ids = tok.convert_tokens_to_ids([BYTE_CHARS[b] for b in "naïve café — ok 😀 done".encode()])
    detok = IncrementalDetokenizer(tok, tok.encode("say:"))
    pieces = [detok.push(i) for i in byte_ids]
    assert "".join(pieces) + detok.flush() == tok.decode(byte_ids)
    assert all("\ufffd" not in p for p in pieces)
    # a lone first byte of a multi-byte character shows up only at the end, as U+FFFD
    lone = tok.convert_tokens_to_ids(BYTE_CHARS[0xF0])
    detok = IncrementalDetokenizer(tok, [])
    assert detok.push(lone) == "" and detok.flush() == "\ufffd"


def test_stop_string_filter_holds_back_possible_prefixes():
    f = StopStringFilter(["STOP", "end"])
    assert f.feed("hello ST") == ("hello ", False)
    assert f.feed("ART e") == ("START ", False)
    assert f.feed("nd more") == ("", True)
    assert f.text == "hello START "
    g = StopStringFilter([])
    assert g.feed("abc") == ("abc", False) and g.flush() == ""


# -- command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["scheduler=nope"], "scheduler: unknown option 'nope'"),
    (["port=-1"], "port must be in [0, 65535]"),
    (["foo=1"], "foo: unknown key"),
    (["chunk_size=64"], "chunk_size: unknown key (did you mean scheduler.chunk_size?)"),
    (["cache.block_size=abc"], "cache.block_size must be an integer, got 'abc'"),
    (["cache.watermark=1.5"], "cache.watermark must be a number in [0, 1), got 1.5"),
    (["cache.gpu_memory_utilization=0"], "cache.gpu_memory_utilization must be a number in (0, 1] or null"),
    (["cache.num_blocks=0"], "cache.num_blocks must be an integer >= 1 or null"),
    (["model=path"], "model.model"),
    (["max_waiting=0"], "max_waiting"),
    (["--api-key"], "--api-key needs a value"),
    (["cache.kv_memory_gib=-1"], "cache.kv_memory_gib must be a number > 0, got -1"),
    (["model.dtype=fp8"], "unknown model.dtype 'fp8'"),
    (["model.runner=simulated", "model.clock=virtual"], "model.clock must be 'real'"),
    (["model.max_model_len=0"], "model.max_model_len must be"),
    (["model.skip_tokenizer_init=maybe"], "model.skip_tokenizer_init must be true or false"),
    (["body_read_timeout_s=0"], "body_read_timeout_s must be a number > 0"),
    (["batch_history_max_records=0"], "batch_history_max_records"),
    (["metrics_require_api_key=maybe"], "metrics_require_api_key must be true or false"),
])
def test_cli_bad_values_exit_2_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_cli_ready_line_and_sigterm():
    exe = Path(sys.executable).with_name("stallfree-serve")
    proc = subprocess.Popen([str(exe), "port=0", "model.dtype=float32", "cache.kv_memory_gib=0.01",
                             "--api-key", "k", "metrics_require_api_key=true"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("stallfree-serve ready: http://127.0.0.1:"), line + proc.stderr.read()
        # the dtype and why, and the kernel of the linears (fp32: oneDNN's packed kernel)
        assert line.rstrip().endswith(" dtype=float32 (model.dtype=float32) linears=onednn"), line
        url = line.split()[2]
        assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
        assert httpx.get(f"{url}/v1/models", trust_env=False).status_code == 401
        assert httpx.get(f"{url}/metrics", trust_env=False).status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer k"}, trust_env=False).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read() and "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
