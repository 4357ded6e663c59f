"""Model shapes against the parameter counts their model cards publish; GPU specifications."""
import pytest

from stallfree.engine.simulator.hardware import GPUS
from stallfree.engine.simulator.shapes import PROFILED, SHAPES


@pytest.mark.parametrize("name, billions", [("mistral-7b", 7.24), ("yi-34b", 34.39), ("llama2-70b", 68.98),
                                            ("falcon-180b", 179.5), ("llama3-8b", 8.03), ("llama2-7b", 6.74),
                                            ("phi-2", 2.78)])
def test_weights_match_the_published_parameter_count(name, billions):
    assert SHAPES[name].weight_bytes(dtype_bytes=2) / 2e9 == pytest.approx(billions, rel=0.01)


def test_kv_bytes_per_token():
    mistral = SHAPES["mistral-7b"]
    assert mistral.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2


def test_every_profiled_shape_is_a_shape_and_every_gpu_has_published_peaks():
    assert set(PROFILED) <= set(SHAPES)
    assert GPUS["h100"].peak_tflops_bf16 > GPUS["a100"].peak_tflops_bf16 > GPUS["a40"].peak_tflops_bf16
    assert GPUS["h200"].mem_bandwidth_gbps > GPUS["h100"].mem_bandwidth_gbps
