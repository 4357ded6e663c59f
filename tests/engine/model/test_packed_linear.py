"""PackedLinear (oneDNN, weights reordered once) computes what nn.Linear computes, and fp32 CPU models
(bf16 ones too, where the CPU has native bf16) use it. Token equality with HF on packed models is in test_engine_correctness.py."""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from stallfree.engine.device import cpu_has_fast_bf16
from stallfree.engine.model.packed_linear import PIECE_ROWS, PackedLinear, can_pack, pack_linears, tune_pieces

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="no oneDNN in this torch")


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(rows, bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)


def test_pack_linears_replaces_every_linear_and_keeps_the_rest():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    x = torch.randn(3, 8)
    expected = model(x)
    pack_linears(model)
    assert [type(m).__name__ for m in model.modules() if not isinstance(m, nn.Sequential)] == [
        "PackedLinear", "ReLU", "PackedLinear"]
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.skipif(not cpu_has_fast_bf16(), reason="no native bf16 on this CPU")
def test_packed_bf16_linear_matches_linear(rows):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=False, dtype=torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    packed = PackedLinear(linear)(x)
    assert packed.dtype == torch.bfloat16
    torch.testing.assert_close(packed, linear(x))  # bf16 tolerances: one rounding of the fp32 accumulator


@pytest.mark.parametrize("bias", [False, True])
def test_a_linear_run_in_pieces_computes_the_same(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    packed = PackedLinear(linear)
    packed.piece_rows = 64
    for rows in (1, 64, 65, 200):
        x = torch.randn(rows, 96)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_tune_pieces_decides_once_per_shape():
    layers = [PackedLinear(nn.Linear(96, 80)) for _ in range(3)] + [PackedLinear(nn.Linear(80, 96))]
    choices = tune_pieces(layers, torch.float32)
    assert set(choices) == {(96, 80), (80, 96)}
    for layer in layers:
        split = choices[(layer.in_features, layer.out_features)]
        assert layer.piece_rows == (PIECE_ROWS if split else None)


def test_what_is_packed():
    assert can_pack(torch.device("cpu"), torch.bfloat16) == cpu_has_fast_bf16()
    assert not can_pack(torch.device("cpu"), torch.float16)
    assert not can_pack(torch.device("cuda"), torch.float32)


def test_fp32_engine_model_uses_packed_linears():
    from stallfree.engine import LLM

    llm = LLM("tiny", dtype="float32")
    model = llm.engine.runner.model
    assert isinstance(model.lm_head, PackedLinear)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())


RSS_AFTER_MANY_BATCH_SIZES = """
import sys

import torch
from stallfree.engine.device import cpu_has_fast_bf16
from stallfree.engine.model.packed_linear import PackedLinear

def rss_mib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024

dtype = getattr(torch, sys.argv[1])
linears = [PackedLinear(torch.nn.Linear(128, 2048, bias=False, dtype=dtype)) for _ in range(2)]  # <= 1 MiB weights
start = rss_mib()
for rows in range(1, 401):
    x = torch.randn(rows, 128, dtype=dtype)
    for linear in linears:
        linear(x)
print(rss_mib() - start)
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_many_batch_sizes_leave_rss_bounded(dtype):
    """oneDNN caches a primitive with a weight copy per input shape: unbounded, 400 batch sizes through two
    1 MiB fp32 weights grew RSS by ~240 MiB (43 MiB bounded)."""
    if not can_pack(torch.device("cpu"), getattr(torch, dtype)):
        pytest.skip(f"{dtype} linears are not packed on this CPU")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", RSS_AFTER_MANY_BATCH_SIZES, dtype], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    assert float(out.stdout) < 150, out.stdout
