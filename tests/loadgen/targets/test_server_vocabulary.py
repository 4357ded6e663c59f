"""loadgen.targets.server_vocabulary: vLLM's (two versions' names), SGLang's and stallfree's own /metrics
pages read in one vocabulary."""
from __future__ import annotations

import pytest

from stallfree.loadgen.targets.server_vocabulary import read_page

# vLLM v1 names, two engines (data parallel): counts summed, the KV-cache fraction averaged
VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 99.0
"""
# older vLLM: gpu_* names, an untyped page
VLLM_OLD = """\
vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
vllm:num_preemptions_total{model_name="m"} 2
vllm:gpu_prefix_cache_queries_total{model_name="m"} 64
vllm:gpu_prefix_cache_hits_total{model_name="m"} 16
"""
SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 162.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2826.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.28
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.0075
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m"} 5.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 8000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 1500.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 500.0
"""


def values(text: str) -> tuple[str | None, dict[str, float], dict[str, str]]:
    page = read_page(text)
    return page.engine, {s.metric: s.value for s in page.samples}, {s.metric: s.series for s in page.samples}


def test_vllm_series_are_combined_over_label_sets():
    engine, got, raw = values(VLLM)
    assert engine == "vllm"
    assert got == {"requests_running": 5, "requests_waiting": 8, "kv_cache_usage": pytest.approx(0.375),
                   "preemptions_total": 4, "prefix_cache_queries_total": 1000, "prefix_cache_hits_total": 250}
    assert raw["preemptions_total"] == "vllm:num_preemptions_total"


def test_older_vllm_names_map_onto_the_same_vocabulary():
    engine, got, raw = values(VLLM_OLD)
    assert engine == "vllm"
    assert got == {"requests_running": 1, "requests_waiting": 0, "kv_cache_usage": 0.125, "preemptions_total": 2,
                   "prefix_cache_queries_total": 64, "prefix_cache_hits_total": 16}
    assert raw["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"


def test_sglang_series():
    engine, got, raw = values(SGLANG)
    assert engine == "sglang"
    assert got == {"requests_running": 162, "requests_waiting": 2826, "kv_cache_usage": 0.28, "preemptions_total": 5,
                   "prefix_cache_queries_total": 8000, "prefix_cache_hits_total": 2000}
    assert raw["requests_waiting"] == "sglang:num_queue_reqs"


def test_stallfree_servers_own_page():
    from stallfree.engine.server.metrics import ServerMetrics

    metrics = ServerMetrics("tiny", max_model_len=256)
    metrics.set_state(num_running=3, num_waiting=2, kv_usage=0.75)
    metrics.preemptions.inc(6)
    metrics.iteration_mfu.observe(0.5)
    metrics.prefix_cache_queries.inc(100)
    metrics.prefix_cache_hits.inc(64)
    metrics.prefix_cache_blocks.set(4)
    metrics.prefix_cache_evictions.inc(2)
    engine, got, _ = values(metrics.render().decode())
    assert engine == "stallfree"
    assert got["requests_running"] == 3 and got["requests_waiting"] == 2 and got["kv_cache_usage"] == 0.75
    assert got["preemptions_total"] == 6
    assert got["iteration_mfu_sum"] == 0.5 and got["iteration_mfu_count"] == 1
    assert got["prefix_cache_queries_total"] == 100 and got["prefix_cache_hits_total"] == 64
    assert got["prefix_cache_blocks"] == 4 and got["prefix_cache_evictions_total"] == 2


def test_an_unknown_engine_gives_no_samples_and_garbage_does_not_parse():
    assert read_page('process_cpu_seconds_total 12.5\nhttp_requests_total{code="200"} 3\n').engine is None
    assert read_page("").samples == []
    with pytest.raises(ValueError):
        read_page("<html><body>Not Found</body></html>")
