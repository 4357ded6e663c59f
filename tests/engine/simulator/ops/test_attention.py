"""Attention grounded in Vidur's A100 profile: prefill over the context, decode over KV lengths."""
import pytest

from stallfree.engine.simulator.hardware import GPUS
from stallfree.engine.simulator.ops.attention import AttentionModel, profile_fit


@pytest.fixture(scope="module")
def a100():
    return AttentionModel.build(GPUS["a100"], heads_per_gpu=32, kv_heads_per_gpu=4, head_dim=128)


def test_the_profile_fit_is_close_to_the_measurements_it_was_fitted_on():
    fit = profile_fit()
    assert fit.prefill_fit_error["median_abs_pct"] < 8 and fit.decode_fit_error["median_abs_pct"] < 15
    # achieved rates below the A100's published peaks (312 TFLOP/s, 2039 GB/s)
    assert 20 < fit.prefill_causal_tflops < fit.prefill_cross_tflops < 312
    assert 500 < fit.decode_gbps < 2039


def test_prefill_grows_quadratically_with_the_chunk_and_linearly_with_its_cached_context(a100):
    one, two = a100.prefill_seconds(((1024, 0),)), a100.prefill_seconds(((2048, 0),))
    assert 3.0 < (two - a100.prefill_launch_s) / (one - a100.prefill_launch_s) < 4.0
    base = a100.prefill_seconds(((512, 0),))
    more = [a100.prefill_seconds(((512, p),)) - base for p in (1000, 2000, 4000)]
    assert more[1] == pytest.approx(2 * more[0]) and more[2] == pytest.approx(4 * more[0])
    # two chunks in one iteration share one launch
    assert a100.prefill_seconds(((512, 0), (512, 0))) == pytest.approx(2 * base - a100.prefill_launch_s)
    assert a100.prefill_seconds(()) == 0.0


def test_decode_is_linear_in_the_context_it_reads_and_free_when_absent(a100):
    small, large = a100.decode_seconds(8, 8_000), a100.decode_seconds(8, 64_000)
    assert (large - a100.decode_launch_s) == pytest.approx(8 * (small - a100.decode_launch_s))
    assert a100.decode_seconds(0, 0) == 0.0


def test_other_gpus_and_head_counts_scale_by_published_peaks_and_work(a100):
    h200 = AttentionModel.build(GPUS["h200"], 32, 4, 128)
    assert h200.per_context_token_s == pytest.approx(a100.per_context_token_s * 2039 / 4800)
    assert h200.per_cross_pair_s == pytest.approx(a100.per_cross_pair_s * 312 / 989)
    half = AttentionModel.build(GPUS["a100"], 16, 2, 128)
    assert half.per_cross_pair_s == pytest.approx(a100.per_cross_pair_s / 2)
    assert half.per_context_token_s == pytest.approx(a100.per_context_token_s / 2)
