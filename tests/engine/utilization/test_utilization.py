"""engine/utilization: FLOPs and bytes counted from the shapes (by hand here), MFU / MBU, the cached machine
limits, and the sampled operator split on a real engine."""
from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.utilization import (
    MachineLimits,
    ModelCounts,
    OperatorSplit,
    UtilizationMeter,
    make_meter,
)
from stallfree.engine.utilization import measured_limits as limits
from tests.helpers.fakes.machine_limits import fake_machine_limits

# hidden 8, 2 heads of 4 (1 KV head), FFN 16, 2 layers, vocab 10
ARCH = ArchConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
                             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                             "vocab_size": 10})


def unit(new: int, cached: int, prefill: bool, samples: bool = True):
    return SimpleNamespace(num_new_tokens=new, num_computed_tokens=cached, is_prefill=prefill, samples=samples)


def test_counts_by_hand():
    counts = ModelCounts.of(ARCH, dtype_bytes=2)
    # per layer: qkv 8 x (8 + 4 + 4) = 128, o 8 x 8 = 64, gate/up/down 3 x 8 x 16 = 384
    assert counts.layer_linear_params == 2 * 576
    assert counts.lm_head_params == 80
    assert counts.attention_flops_per_pair == 4 * 2 * 8  # layers x (QK^T + PV) x heads x head_dim
    assert counts.kv_bytes_per_token == 2 * 2 * 4 * 2  # K and V x layers x KV width x bf16
    assert counts.weight_bytes == (1152 + 80) * 2


def test_work_by_hand():
    counts = ModelCounts.of(ARCH, dtype_bytes=2)
    # a 3-token chunk after 2 cached tokens (causal pairs 3 x 2 + 1 + 2 + 3 = 12) and a decode at context 5
    work = counts.work([unit(1, 4, False), unit(3, 2, True)])
    assert work.flops == 2 * (1152 * 4 + 80 * 2) + 64 * (12 + 5)
    # weights, K/V read once (what was cached: the chunk's 2, the decode's 4), K/V written (4 new tokens)
    assert work.bytes_moved == 2464 + 32 * (6 + 4)
    # a chunk that samples nothing has no lm_head row
    assert counts.work([unit(3, 0, True, samples=False)]).flops == 2 * 1152 * 3 + 64 * 6


def test_meter_fields():
    counts = ModelCounts.of(ARCH, dtype_bytes=2)
    work = counts.work([unit(3, 0, True)])
    meter = UtilizationMeter(counts, MachineLimits("test", "bfloat16", peak_flops=1e4, bandwidth=1e3, source="x"))
    f = meter.fields([unit(3, 0, True)], 2.0, OperatorSplit(linear_s=1.2, attention_s=0.3))
    assert f["mfu"] == pytest.approx(work.flops / 2e4) and f["mbu"] == pytest.approx(work.bytes_moved / 2e3)
    assert (f["linear_s"], f["attention_s"], f["other_s"]) == pytest.approx((1.2, 0.3, 0.5))
    unknown = UtilizationMeter(counts, None).fields([unit(3, 0, True)], 2.0, None)
    assert set(unknown) == {"model_flops", "bytes_moved"}


def test_an_iteration_above_the_measured_peak_raises_it():
    counts = ModelCounts.of(ARCH, dtype_bytes=2)
    units = [unit(3, 0, True)]
    work = counts.work(units)
    meter = UtilizationMeter(counts, MachineLimits("test", "bfloat16", peak_flops=work.flops / 4, bandwidth=1.0,
                                                   source="x"))
    assert meter.fields(units, 2.0, None)["mfu"] == 1.0  # twice the measured peak: the peak was low
    assert meter.limits.peak_flops == work.flops / 2
    assert meter.fields(units, 4.0, None)["mfu"] == pytest.approx(0.5)
    assert meter.fields(units, 2.0, None)["mbu"] > 1  # bytes faster than memory are the caches', no low limit


def test_limits_measured_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("STALLFREE_CACHE", str(tmp_path))
    calls = []

    def fake_measure(device, dtype):  # the measurement itself is timing, not under test here
        calls.append(dtype)
        return MachineLimits("dev", str(dtype), 1e12, 1e10, "measured")
    monkeypatch.setattr(limits, "measure", fake_measure)
    cpu = torch.device("cpu")
    first = limits.machine_limits(cpu, torch.float32)
    assert limits.machine_limits(cpu, torch.float32) == first and len(calls) == 1
    limits.machine_limits(cpu, torch.bfloat16)  # another dtype: measured apart
    limits.machine_limits(cpu, torch.float32, refresh=True)
    assert len(calls) == 3 and (tmp_path / "machine_limits.json").is_file()


def test_only_trials_that_held_their_cores_count(monkeypatch):
    """A trial in which the process did not run (here: slept, as if another process had its core) is no
    measure of the machine: best_rate warns that its figure is low."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)

    def spin():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert limits.best_rate(1.0, spin, trials=2, repeats=1) > 0
    with pytest.warns(limits.LowLimitWarning, match="low"):
        limits.best_rate(1.0, lambda: time.sleep(0.002), trials=2, repeats=1)


def test_a_kernel_on_fewer_threads_than_torch_has_holds_its_cores(monkeypatch):
    """A kernel that runs on one thread (a bf16 matmul on a CPU without native bf16) holds its core though the
    process has two threads: its trials count, and no warning says the limit is low."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)

    def spin():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
    assert limits.kernel_threads([(0.99, 1.0), (0.5, 1.0)]) == 1 and limits.kernel_threads([(1.9, 1.0)]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert limits.best_rate(1.0, spin, trials=2, repeats=1) > 0


def test_limits_measured_busy_give_no_utilisation():
    """A limit measured on a busy machine is low: a utilisation against it could pass 1, so none is reported."""
    busy = MachineLimits("dev", "float32", 1e12, 1e10, "measured 2026-01-01" + limits.BUSY)
    assert busy.busy and not MachineLimits("dev", "float32", 1e12, 1e10, "measured 2026-01-01").busy
    runner = SimpleNamespace(machine_limits=busy)
    meter = make_meter("simulated", runner, ARCH, torch.device("cpu"), torch.float32)
    assert meter.limits is None and "mbu" not in meter.fields([unit(3, 0, True)], 1.0, None)


def test_engine_records_utilisation_and_split(tiny_path):
    with fake_machine_limits():
        engine = LLMEngine.from_kwargs(model=str(tiny_path), scheduler="sarathi", chunk_size=64, op_split_every=2)
    model = engine.runner.model
    # a tiled gate_up projection with SiLU-and-mul (engine/model/tiled_linear.py) outputs half the features it holds
    linear = sum(m.in_features * m.out_features * (2 if getattr(m, "silu_and_mul", False) else 1)
                 for m in model.modules() if hasattr(m, "out_features"))
    assert linear == engine.utilization.counts.layer_linear_params + engine.utilization.counts.lm_head_params
    engine.add_request([5] * 40, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    records = engine.batch_records
    first = records[0]  # the whole prompt, one chunk
    assert first.model_flops == engine.utilization.counts.work([unit(40, 0, True)]).flops
    assert all(r.mfu is not None and 0 < r.mfu and 0 < r.mbu for r in records)
    sampled = [r for r in records if r.linear_s is not None]
    assert [r.iteration for r in sampled] == [r.iteration for r in records if r.iteration % 2 == 1]
    for r in sampled:
        assert r.linear_s > 0 and r.attention_s > 0 and r.other_s >= 0
        assert r.linear_s + r.attention_s + r.other_s == pytest.approx(r.end_time - r.start_time)


def test_bad_split_interval(tiny_path):
    with pytest.raises(ValueError, match="op_split_every"):
        LLMEngine.from_kwargs(model=str(tiny_path), op_split_every=-1)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["auto", "float32"])  # auto: bf16 where the CPU has it (the tiled linears)
def test_utilisation_of_small_is_a_fraction(caplog, dtype):
    """Over real iterations of ``small``: lone prefills of 128-2,048 tokens (FLOPs, the MFU that a wrong count or a
    low peak pushes over 1) and decode steps at batch 1 (its weights streamed from memory: the MBU that a wrong
    bytes count or a limit measured low pushes over 1) to 128 (more KV, more FLOPs), against this machine's
    measured limits. A busy machine only lengthens the iterations, so the bound still holds; where the limits
    themselves were measured on a busy machine no utilisation is reported at all."""
    engine = LLMEngine.from_kwargs(model="small", dtype=dtype, scheduler="vllm", max_num_seqs=128,
                                   max_num_batched_tokens=4096)
    one_token = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for length in (128, 512, 2048):
        engine.add_request([7 + length % 50] * length, one_token)
        while engine.has_unfinished():
            engine.step()
    for batch in (1, 8, 32, 128):
        for i in range(batch):
            engine.add_request([5 + i] * 64, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    records = engine.batch_records
    assert {r.num_prefill_tokens for r in records if r.num_decode_seqs == 0} >= {128, 512, 2048}
    assert {r.num_decode_seqs for r in records if r.num_prefill_tokens == 0} == {1, 8, 32, 128}
    if engine.utilization.limits is None:
        assert "MFU and MBU not reported" in caplog.text and "busy machine" in caplog.text
        assert all(r.mbu is None and r.mfu is None for r in records)
    else:
        assert all(0 < r.mbu <= 1 and 0 < r.mfu <= 1 for r in records), \
            [(r.num_prefill_tokens, r.num_decode_seqs, r.mbu, r.mfu) for r in records]
