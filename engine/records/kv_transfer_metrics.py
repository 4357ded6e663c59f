"""The summary's KV-transfer fields (summary_parts.KvTransfers) from the measured requests of a disaggregated
deployment (requests.parquet ``kv_transfer_*``, filled by a decode instance)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from stallfree.engine.records.summary_parts import KvTransfers


def kv_transfer_summary(df: pd.DataFrame) -> dict:
    """``KvTransfers``' fields of ``df`` (request_metrics rows); all None when no request moved KV."""
    moved = df[df["kv_transfer_bytes"].notna()] if "kv_transfer_bytes" in df else df.iloc[0:0]
    if moved.empty:
        return dataclasses.asdict(KvTransfers())
    ms = 1e3 * (moved["kv_transfer_end"] - moved["kv_transfer_start"]).to_numpy(dtype=float)
    return dataclasses.asdict(KvTransfers(
        kv_transfers=len(moved), median_kv_transfer_bytes=float(moved["kv_transfer_bytes"].median()),
        median_kv_transfer_ms=float(np.median(ms)), p99_kv_transfer_ms=float(np.percentile(ms, 99))))
