"""stallfree-bench end to end on tiny with text workloads: repeats on seeds, vLLM-style goodput and the
CPU-share fields in-process, and chat load over HTTP from a client that gives way to its server."""
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from stallfree.loadgen.config.checks import ConfigError, validate_cli
from tests.helpers.bench import bench, run_dirs
from tests.helpers.paths import DATA


def _summaries(exp_dir: Path) -> list[dict]:
    return [json.loads((d / "summary.json").read_text()) for d in run_dirs(exp_dir)]


@pytest.mark.slow
def test_sonnet_repeats_inprocess(tmp_path):
    args = ["workload=sonnet", "workload.lengths.input_len=96", "workload.lengths.prefix_len=32",
            "workload.lengths.output_len=8", "num_requests=4", "qps=8", "repeats=2", "slo.tbt_ms=1000",
            "slo.goodput='ttft:60000 tpot:60000'", "experiment_name=text", f"results_dir={tmp_path}"]
    done = bench(args, tmp_path)
    assert done.returncode == 0, done.stderr
    summaries = _summaries(tmp_path / "text")
    assert sorted(s["seed"] for s in summaries) == [0, 1]
    assert len({s["point_id"] for s in summaries}) == 1 and len({s["run_id"] for s in summaries}) == 2
    for s in summaries:
        assert s["completed"] == 4 and s["workload"] == "sonnet"
        assert s["request_goodput_vllm"] == pytest.approx(s["request_throughput"])
        assert s["slo_goodput"] == "ttft:60000 tpot:60000"
        assert s["mean_e2el_from_send_ms"] <= s["mean_e2el_ms"]
        assert isinstance(s["disturbed"], bool) and 0 < s["engine_cpu_share"] <= 1
        assert s["engine_threads"] >= 1 and 0 <= s["others_cpu_share"] <= 1
    requests = pd.read_parquet(run_dirs(tmp_path / "text")[0] / "requests.parquet")
    assert requests["prompt_tokens"].between(60, 140).all() and (requests["output_tokens"] == 8).all()


@pytest.mark.slow
def test_chat_over_http_from_a_jsonl_file(tmp_path):
    args = ["target=http", "target.client_nice=5", "target.endpoint=chat", "workload=jsonl", f"workload.lengths.path={DATA / 'requests_sample.jsonl'}",
            "num_requests=3", "qps=4", "slo.tbt_ms=1000", "experiment_name=chat", f"results_dir={tmp_path}"]
    done = bench(args, tmp_path)
    assert done.returncode == 0, done.stderr
    [summary] = _summaries(tmp_path / "chat")
    assert summary["completed"] == 3 and summary["failed"] == 0
    assert summary["engine_cpu_share"] is not None  # the server process the bench started
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # the bench's and so its server's
    assert summary["cpu_placement"] == "subprocess" and summary["engine_nice"] == nice
    assert summary["loadgen_nice"] == min(19, nice + 5)  # target.client_nice
    assert summary["loadgen_cpu_s"] > 0 and summary["loadgen_cpu_ms_per_request"] > 0
    requests = pd.read_parquet(run_dirs(tmp_path / "chat")[0] / "requests.parquet")
    assert requests["output_tokens"].tolist() == [12, 8, 5]


@pytest.mark.parametrize(("args", "message"), [
    (["target=http", "target.endpoint=chat"], "target.endpoint must be completions for a workload of token ids"),
    (["target=http", "target.endpoint=grpc"], "target.endpoint must be one of"),
    (["workload=sharegpt"], "workload.lengths.path is required"),
    (["workload=jsonl", "workload.lengths.path=/nonexistent.jsonl"], "workload.lengths.path must be an existing file"),
    (["slo.goodput=ttft:abc"], "slo.goodput must be KEY:MS items"),
    (["slo.goodput=itl:5"], "slo.goodput keys are"),
    (["repeats=0"], "repeats must be an integer >= 1"),
    (["min_engine_cpu_share=2"], "min_engine_cpu_share must be a number in [0, 1]"),
    (["target=http", "target.client_nice=-1"], "target.client_nice must be an integer in [0, 19]"),
])
def test_config_errors_of_the_new_keys(args, message):
    with pytest.raises(ConfigError) as info:
        validate_cli(args)
    assert str(info.value).startswith(message), str(info.value)
