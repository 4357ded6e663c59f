"""A shared-prefix run end to end: the summary's ideal hit rate is what the engine's prefix cache reaches,
and a simulated engine charges only the tokens it computes."""
import json

import pandas as pd
import pytest

from tests.helpers.bench import bench, run_dirs


@pytest.mark.slow
def test_a_shared_prefix_run_reaches_its_ideal_hit_rate(tmp_path):
    args = ["-m", "model.runner=simulated", "model.clock=virtual", "num_requests=24", "qps=2", "workload=shared_prefix",
            "workload.lengths.prefix_len=96", "workload.lengths.suffix_len=8", "workload.lengths.output_len=4",
            "cache.enable_prefix_caching=true,false", "slo.tbt_ms=1000", "experiment_name=prefix",
            f"results_dir={tmp_path}"]
    done = bench(args, tmp_path)
    assert done.returncode == 0, done.stderr
    runs = {}
    for run_dir in run_dirs(tmp_path / "prefix"):
        summary = json.loads((run_dir / "summary.json").read_text())
        config = (run_dir / "config.yaml").read_text()
        runs["enable_prefix_caching: true" in config] = (summary, pd.read_parquet(run_dir / "requests.parquet"),
                                                         pd.read_parquet(run_dir / "batches.parquet"))
    (on, on_requests, on_batches), (off, off_requests, off_batches) = runs[True], runs[False]
    ideal = (24 - 8) * 96 / (24 * 104)
    assert on["workload_ideal_hit_rate"] == off["workload_ideal_hit_rate"] == pytest.approx(ideal)
    assert on["prefix_cache_reset"] == off["prefix_cache_reset"] == "reset"
    assert on_requests["cached_tokens"].sum() / on_requests["prompt_tokens"].sum() == pytest.approx(ideal)
    assert off_requests["cached_tokens"].sum() == 0
    computed_on, computed_off = on_batches["num_prefill_tokens"].sum(), off_batches["num_prefill_tokens"].sum()
    assert computed_on == computed_off - on_requests["cached_tokens"].sum()
    assert on_batches["num_cached_tokens"].sum() == on_requests["cached_tokens"].sum()
