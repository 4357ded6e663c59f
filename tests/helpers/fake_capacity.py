"""A capacity search whose points a test's fake ``run_point`` measures (loadgen.sweep.capacity_search)."""
from __future__ import annotations

from hydra import compose, initialize_config_dir

from stallfree.engine.hydra_config import CONF_DIR
from stallfree.engine.records.request_metrics import UnloadedTtft
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep import capacity_search as capacity


def search_on(monkeypatch, tmp_path, fake_run_point, overrides: list[str], unloaded_ms: float = 1.0) -> dict:
    """capacity_search.run_search with ``fake_run_point`` measuring every point, a 100 ms SLO and an unloaded
    TTFT of ``unloaded_ms``: the capacity record."""
    monkeypatch.setattr(capacity, "run_point", fake_run_point)
    monkeypatch.setattr(capacity, "resolve_slo", lambda cfg, exp_dir, targets: {
        "slo_name": "strict", "slo_tbt_ms": 100.0, "decode_iter_ms": None})
    monkeypatch.setattr(capacity, "cached_unloaded_ttft", lambda cfg, exp_dir, targets: (
        UnloadedTtft(unloaded_ms, 0.0), {"intercept_ms": unloaded_ms}))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", ["+experiment=capacity", *overrides, f"results_dir={tmp_path}"]))
    return capacity.run_search(cfg, targets=None)
