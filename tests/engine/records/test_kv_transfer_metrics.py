"""The summary's KV-transfer fields: None without transfers, medians and a P99 over the requests that moved KV."""
import pandas as pd
import pytest

from stallfree.engine.records.kv_transfer_metrics import kv_transfer_summary


def test_no_transfers_no_figures():
    assert set(kv_transfer_summary(pd.DataFrame({"status": ["ok"]})).values()) == {None}
    frame = pd.DataFrame({"kv_transfer_bytes": [None], "kv_transfer_start": [None], "kv_transfer_end": [None]})
    assert kv_transfer_summary(frame)["kv_transfers"] is None


def test_transfers_are_summarised_over_the_requests_that_moved_kv():
    frame = pd.DataFrame({"kv_transfer_bytes": [100.0, 300.0, None], "kv_transfer_start": [1.0, 2.0, None],
                          "kv_transfer_end": [1.002, 2.004, None]})
    summary = kv_transfer_summary(frame)
    assert summary["kv_transfers"] == 2 and summary["median_kv_transfer_bytes"] == 200.0
    assert summary["median_kv_transfer_ms"] == pytest.approx(3.0)
    assert summary["p99_kv_transfer_ms"] == pytest.approx(3.98)
