"""target=inprocess with parallel.disaggregation=1p1d: every request's KV transfer in its record and in the
summary, the prefill instance's iterations among the replay's batches."""
from stallfree.engine.hydra_config import CONF_DIR
from stallfree.engine.records.request_metrics import summarize
from stallfree.loadgen.results.run_dir import requests_frame
from stallfree.loadgen.workload.request_specs import build_workload


def test_a_disaggregated_replay_records_each_transfer(tmp_path):
    from hydra import compose, initialize_config_dir

    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.targets.inprocess import InProcessTarget

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", ["model=tiny", "model.dtype=float32", "cache.enable_prefix_caching=true",
                                           "parallel.disaggregation=1p1d"]))
    target = InProcessTarget(cfg, tmp_path)
    try:
        specs = build_workload({"kind": "poisson", "qps": 20}, {"kind": "fixed", "prompt": 40, "output": 3}, 6, 0,
                               1000)
        done = target.replay(specs, warmup=0, progress=None)
    finally:
        target.close()
    assert [r.status for r in done.records] == ["ok"] * 6
    assert {b.instance for b in done.batches} == {"prefill-0", "decode-0"}
    for record in done.records:
        assert record.kv_transfer_bytes > 0 and record.cached_tokens == 32  # two 16-token blocks moved
        assert record.intended_send_time <= record.kv_transfer_start <= record.kv_transfer_end
        assert record.kv_transfer_end <= record.first_token_time
    summary = summarize(requests_frame(done.records))
    assert summary["kv_transfers"] == 6 and summary["median_kv_transfer_bytes"] == done.records[0].kv_transfer_bytes
    assert 0 <= summary["median_kv_transfer_ms"] <= summary["p99_kv_transfer_ms"]
