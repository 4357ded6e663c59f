"""FAKE machine limits for engines built in a test of what carries MFU and MBU (records, metrics, studies),
not of the limits: the real ones, measured on a busy machine, give no utilisation at all
(engine/utilization/measured_limits.py)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stallfree.engine import utilization
from stallfree.engine.utilization import MachineLimits

FAKE_PEAK_FLOPS, FAKE_BANDWIDTH = 1e12, 1e10


@contextmanager
def fake_machine_limits() -> Iterator[None]:
    """Engines built inside measure against FAKE limits (1 TFLOP/s, 10 GB/s)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utilization, "machine_limits", lambda device, dtype: MachineLimits(
            "FAKE device", str(dtype).removeprefix("torch."), FAKE_PEAK_FLOPS, FAKE_BANDWIDTH, "FAKE"))
        yield
