"""The report's prefix-reuse and sessions table."""
import pandas as pd

from stallfree.analysis.reuse import reuse_table


def test_each_run_says_how_its_servers_hit_rate_compares_with_the_workloads():
    runs = pd.DataFrame({"config": ["sarathi-512", "vllm", "sarathi-512", "vllm"], "engine_label": [None, None,
                         "vllm 0.32.0 (url)", None], "workload": ["chat", "chat", "chat", "arxiv"],
                         "qps": [1.0, 1.0, 1.0, 2.0], "workload_ideal_hit_rate": [0.6, 0.6, 0.6, 0.0],
                         "server_prefix_cache_hit_rate": [0.59, 0.95, None, 0.0],
                         "num_sessions": [10, 10, 10, None], "median_ttft_follow_up_ms": [12.0, 10.0, 30.0, None]})
    table = reuse_table(runs)
    assert list(table["run"]) == ["sarathi-512", "vllm", "vllm 0.32.0 (url)", "vllm"]
    assert list(table["check"]) == ["ok", "warm cache?", "unknown", "ok"]
    assert list(table["server hit %"].astype(object).where(table["server hit %"].notna(), None)) == [59.0, 95.0,
                                                                                                    None, 0.0]
    assert list(table["TTFT follow-up p50 (ms)"].iloc[:3]) == [12.0, 10.0, 30.0]


def test_runs_without_reuse_figures_leave_the_section_out():
    assert reuse_table(pd.DataFrame({"config": ["vllm"], "qps": [1.0]})).empty
    no_sessions = reuse_table(pd.DataFrame({"config": ["vllm"], "workload_ideal_hit_rate": [0.2],
                                            "server_prefix_cache_hit_rate": [0.05]}))
    assert list(no_sessions["check"]) == ["less than ideal"] and "sessions" not in no_sessions
