"""``model.dtype=auto`` (engine.device.choose_dtype): bf16 where the hardware computes it natively (CUDA, a CPU
with AMX-BF16 or AVX512-BF16), fp32 where bf16 would be emulated; the choice says why. ``smollm2`` uses it, so
a default run is in bf16 wherever vLLM runs the model in bf16."""
from __future__ import annotations

import pytest
import torch

from stallfree.engine import device
from stallfree.engine.device import choose_dtype
from stallfree.engine.hydra_config import compose


@pytest.mark.parametrize("native, dtype, why", [(True, torch.bfloat16, "has native bf16"),
                                                (False, torch.float32, "has no native bf16")])
def test_auto_on_a_cpu(monkeypatch, native, dtype, why):
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: native)
    choice = choose_dtype("auto", "cpu")
    assert choice.dtype == dtype and str(choice) == f"{choice.name} (model.dtype=auto: this CPU {why} (AMX-BF16 / AVX512-BF16))"


def test_auto_on_cuda_and_a_setting_of_its_own():
    assert choose_dtype("auto", torch.device("cuda")).dtype == torch.bfloat16
    assert str(choose_dtype("float32", "cpu")) == "float32 (model.dtype=float32)"
    with pytest.raises(ValueError, match="unknown model.dtype 'fp8'"):
        choose_dtype("fp8", "cpu")


@pytest.mark.parametrize("preset", ["smollm2", "small"])
def test_presets_choose_like_vllm(preset):
    assert compose("serve", [f"model={preset}"], "test")["model"]["dtype"] == "auto"
