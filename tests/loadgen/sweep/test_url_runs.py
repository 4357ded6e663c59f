"""Runs on a server the bench did not start (target=url), against the FAKE SSE server (the harness is under
test, not a server): the server's own label names the run everywhere, requests take the shape the server
accepts, early stops and a server that dies mid-run are recorded, and a capacity preset searches once."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir

from stallfree.analysis.load import coverage_note, load_runs
from stallfree.analysis.vllm_format import export_vllm
from stallfree.loadgen.config.checks import CONF_DIR
from stallfree.loadgen.config.errors import EXIT_CONFIG, TargetError, exit_on_error
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.live_target import WARMUP_REQUESTS, LiveTarget
from stallfree.loadgen.sweep.plan import plan_run
from stallfree.loadgen.sweep.point import run_point
from tests.helpers.fakes.fake_sse_server import FakeBehaviour, running_fake_server

VLLM = FakeBehaviour(owned_by="vllm", version="0.32.0", server_header="uvicorn")
LABEL = "vllm 0.32.0 (url)"
RUN = ["model=tiny", "target=url", "workload=fixed", "workload.lengths.prompt=12", "workload.lengths.output=4",
       "num_requests=4", "arrival=constant", "qps=40", "slo.tbt_ms=1000"]


def config(url: str, tmp_path: Path, *overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", [*RUN, f"target.url={url}", f"results_dir={tmp_path}", *overrides]))


def measure(url: str, tmp_path: Path, *overrides: str) -> dict:
    targets = LiveTarget()
    try:
        return run_point(config(url, tmp_path, *overrides), targets)
    finally:
        targets.close()


def test_the_servers_label_names_the_run_its_config_summary_export_and_report(tmp_path):
    with running_fake_server(1, 1, VLLM) as url:
        plans = [plan_run(config(url, tmp_path, f"scheduler={s}", f"scheduler.chunk_size={c}"))
                 for s, c in (("sarathi", 512), ("vllm", 256))]
        summary = measure(url, tmp_path, "scheduler=sarathi")
    assert plans[0].run_id == plans[1].run_id == summary["run_id"]  # the bench's engine knobs are not the server's
    assert summary["run_id"].startswith("engine=vllm-0.32.0-url,qps=40.0,cfg=")
    assert (summary["engine_label"], summary["scheduler"], summary["chunk_size"]) == (LABEL, LABEL, None)
    assert summary["model"] == "fake-model"
    run_dir = tmp_path / "default" / summary["run_id"]
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert not {"scheduler", "chunk_size", "model"} & set(written)
    assert written["target"]["label"] == LABEL and written["target"]["served_model"] == "fake-model"
    assert written["prompt_tokenizer"] == "tiny"
    [exported] = export_vllm(load_runs(tmp_path / "default"), tmp_path / "vllm")
    assert json.loads(exported.read_text())["backend"] == LABEL
    note = coverage_note(load_runs(tmp_path / "default"))
    assert f"{LABEL}: 1" in note and "No runs for policies" not in note


def test_a_label_falls_back_to_the_server_header():
    from stallfree.loadgen.targets.server_check import describe_server

    plain = FakeBehaviour(owned_by="", version="", server_header="someserver/4.5")
    with running_fake_server(1, 1, plain) as url:
        assert describe_server(url, None).label == "someserver 4.5 (url)"


def test_text_prompts_by_default_and_token_ids_only_where_taken(tmp_path):
    with running_fake_server(1, 1, FakeBehaviour(reject_token_ids=True)) as url:
        text = measure(url, tmp_path)
        auto = measure(url, tmp_path, "target.token_ids=auto")
    assert text["completed"] == auto["completed"] == 4
    assert (text["prompt_form"], auto["prompt_form"], text["ignore_eos"]) == ("text", "text", True)
    with running_fake_server(1, 1) as url:
        assert measure(url, tmp_path, "target.token_ids=auto")["prompt_form"] == "token_ids"


def test_a_server_that_rejects_ignore_eos_is_not_sent_it_and_its_early_stops_are_reported(tmp_path, capsys):
    with running_fake_server(1, 1, FakeBehaviour(reject_ignore_eos=True, stop_after=2)) as url:
        summary = measure(url, tmp_path)
    assert summary["ignore_eos"] is False and summary["completed"] == 4
    assert summary["early_stop_fraction"] == 1.0
    assert summary["output_length_histogram"] == {"<25%": 0, "25-50%": 0, "50-75%": 4, "75-<100%": 0, "100%": 0}
    assert (summary["requested_output_tokens"], summary["served_output_tokens"]) == (16, 8)
    assert "warning: 100% of the completed requests ended before max_tokens" in capsys.readouterr().out


def test_a_server_that_ignores_ignore_eos_is_caught(tmp_path, capsys):
    with running_fake_server(1, 1, FakeBehaviour(stop_after=3)) as url:
        summary = measure(url, tmp_path)
    assert summary["ignore_eos"] is True and summary["early_stop_fraction"] == 1.0
    assert "the server ignored ignore_eos" in capsys.readouterr().out


def test_a_rejected_request_shape_is_one_line_that_names_the_option(tmp_path, capsys):
    with running_fake_server(1, 1, FakeBehaviour(reject_token_ids=True)) as url:
        with pytest.raises(SystemExit) as exited:
            exit_on_error("stallfree-bench", lambda: measure(url, tmp_path, "target.token_ids=true"))
    assert exited.value.code == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == [
        "stallfree-bench: config error: the server rejected token-id prompts (HTTP 400: prompt must be a string): "
        "set target.token_ids=false"]


def test_a_server_that_dies_mid_run_leaves_every_request_a_row_and_a_failed_run(tmp_path, capsys):
    probes = 1  # ignore_eos: auto (token ids are not asked for)
    served = 2
    with running_fake_server(1, 1, FakeBehaviour(die_after=probes + WARMUP_REQUESTS + served)) as url:
        summary = measure(url, tmp_path, "num_requests=6", "qps=20")
    # the request that kills it, and those after, fail; one still in flight then (a slow machine) fails too
    assert 1 <= summary["completed"] <= served and summary["completed"] + summary["failed"] == 6
    assert summary["failed_run"] is True and "lost the connection to the target" in summary["failed_reason"]
    requests = pd.read_parquet(tmp_path / "default" / summary["run_id"] / "requests.parquet")
    failed = requests[requests["status"] == "error"]
    assert len(requests) == 6 and len(failed) == summary["failed"] and failed["error"].notna().all()
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[failed]")]
    assert "failed run:" in line


def test_a_server_dead_before_a_run_is_one_line_target_error(tmp_path):
    with running_fake_server(1, 1, FakeBehaviour(die_after=1 + WARMUP_REQUESTS)) as url:
        with pytest.raises(TargetError, match="all 4 requests of engine=fake-engine-1.2.3-url.* failed"):
            measure(url, tmp_path)


@pytest.mark.parametrize("slo", ["strict"])
def test_a_capacity_preset_searches_a_server_once(tmp_path, capsys, slo):
    targets = LiveTarget()
    search = [f"slo={slo}", "mode=capacity", "capacity.start_qps=64", "capacity.max_qps=128",
              "capacity.min_qps=32", "experiment_name=capacity"]
    try:
        with running_fake_server(1, 1, VLLM) as url:
            first = run_search(config(url, tmp_path, "scheduler=vllm", *search), targets)
            second = run_search(config(url, tmp_path, "scheduler=sarathi", *search), targets)
    finally:
        targets.close()
    assert first == second and first["scheduler"] == LABEL
    out = capsys.readouterr().out
    assert f"scheduler=sarathi slo={slo}: same search as scheduler=vllm slo={slo} ({LABEL}), not run again" in out
    assert len(json.loads((tmp_path / "capacity" / "capacity.json").read_text())) == 1
