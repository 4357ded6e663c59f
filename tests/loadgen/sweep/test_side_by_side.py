"""+experiment=compare (loadgen.sweep.side_by_side): every contender through the same QPS points and capacity
search, a url contender whose server is not up skipped with one line, and the report that overlays them."""
import json

import nbformat
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.config.checks import CONF_DIR, CONFIG_NAME, validate_cli
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.side_by_side import run_compare
from tests.helpers.bench import bench, run_dirs
from tests.helpers.fakes.fake_sse_server import running_fake_server
from tests.loadgen.sweep.test_user_mistakes import closed_port

QUICK = ["model=tiny", "workload=fixed", "workload.lengths.prompt=16", "workload.lengths.output=8",
         "num_requests=4", "compare.qps=[4,8]", "slo.tbt_ms=2000", "capacity.start_qps=8", "capacity.max_qps=16",
         "capacity.tolerance=0.5", "capacity.min_duration_s=2", "min_engine_cpu_share=0",
         "capacity.unsure_remeasures=0"]  # 112 gaps a point: too few for a sure pass, and not what is tested here


def composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return load_bench(compose(CONFIG_NAME, ["+experiment=compare", *overrides]))


def test_each_contender_is_its_engine_on_the_same_model_and_slo():
    contenders = {name: composed(f"+contender={name}") for name in ("stallfree_vllm", "stallfree_sarathi", "vllm_url")}
    assert {name: (c.target.kind, c.target.url) for name, c in contenders.items()} == {
        "stallfree_vllm": ("http", None), "stallfree_sarathi": ("http", None),
        "vllm_url": ("url", "http://127.0.0.1:8300")}
    assert contenders["stallfree_vllm"].scheduler.policy == "vllm"
    assert contenders["stallfree_sarathi"].scheduler.policy == "sarathi"
    for name, c in contenders.items():
        assert (c.mode, c.compare.contender, c.compare.qps, c.model.model) == ("compare", name, [1, 2, 4], "small")
        assert c.slo.reference_probe == "stallfree"  # one SLO of this machine for every engine, not each one's probe
        assert (c.slo.name, c.capacity.min_qps) == ("relaxed", 0.25)
    validate_cli(["+experiment=compare"])  # every contender of the preset's sweep checks


def test_compare_settings_are_checked():
    with pytest.raises(ConfigError, match=r"compare.qps must be a non-empty list of numbers > 0"):
        composed("+contender=stallfree_vllm", "compare.qps=[1,-2]")
    with pytest.raises(ConfigError, match=r"compare.contender is required"):
        composed()
    with pytest.raises(ConfigError, match=r"mode must be 'compare' only with \+experiment=compare"):
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            load_bench(compose(CONFIG_NAME, ["mode=compare"]))


def test_a_url_contender_runs_its_points_and_capacity_search_on_the_fake_server(tmp_path):
    with running_fake_server(ttft_ms=20, tbt_ms=5) as url:
        cfg = composed("+contender=vllm_url", f"compare.vllm_url={url}", f"results_dir={tmp_path}", *QUICK)
        targets = LiveTarget()
        try:
            record = run_compare(cfg, targets)
        finally:
            targets.close()
    assert json.loads((tmp_path / "compare" / "compare.json").read_text()) == [record]
    assert (record["contender"], record["status"], record["scheduler"], record["target"]) == (
        "vllm_url", "measured", "fake-engine 1.2.3 (url)", "url")
    # the FAKE streams a token every 5 ms whatever the load: max_qps passes, a lower bound
    assert (record["capacity_qps"], record["bracketed"], record["hi_qps"]) == (16.0, False, None)
    summaries = {d.name: json.loads((d / "summary.json").read_text()) for d in run_dirs(tmp_path / "compare")}
    assert [summaries[run_id]["qps"] for run_id in record["run_ids"]] == [4.0, 8.0]
    assert all(summaries[run_id]["capacity_search"] is None for run_id in record["run_ids"])
    assert sorted(s["qps"] for s in summaries.values() if s.get("capacity_search") == "relaxed") == [8.0, 16.0]


def test_a_url_contender_without_a_server_is_skipped_with_one_line_and_recorded_missing(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = composed("+contender=vllm_url", f"compare.vllm_url={url}", f"results_dir={tmp_path}", *QUICK)
    record = run_compare(cfg, LiveTarget())
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("[compare] vllm_url skipped: ") and record["reason"] in line
    assert f"compare.vllm_url={url}" in line and "vllm serve MODEL --port" in line
    assert json.loads((tmp_path / "compare" / "compare.json").read_text()) == [
        {"contender": "vllm_url", "status": "missing", "reason": record["reason"], "url": url}]
    assert not run_dirs(tmp_path / "compare")


@pytest.mark.slow
def test_the_preset_compares_stallfree_policies_with_a_url_server_in_one_report(tmp_path):
    from stallfree.analysis.report import main as report

    with running_fake_server(ttft_ms=20, tbt_ms=5) as url:
        done = bench(["+experiment=compare", f"compare.vllm_url={url}", *QUICK], tmp_path, timeout=480)
    assert done.returncode == 0, done.stderr
    exp_dir = tmp_path / "results" / "compare"
    records = json.loads((exp_dir / "compare.json").read_text())
    assert {(r["contender"], r["status"], r["scheduler"]) for r in records} == {
        ("vllm_url", "measured", "fake-engine 1.2.3 (url)"), ("stallfree_vllm", "measured", "vllm"),
        ("stallfree_sarathi", "measured", "sarathi")}
    assert report([str(exp_dir)]) == 0
    notebook = nbformat.read(exp_dir / "notebooks" / "compare.ipynb", as_version=4)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    assert all((exp_dir / "figures" / f).stat().st_size > 10_000 for f in ("compare_frontiers.png", "compare_capacity.png"))
    html = (exp_dir / "report.html").read_text()
    assert "Engines side by side" in html and "stallfree sarathi-256" in html and "stallfree vllm" in html
    assert "Pareto frontiers" not in html  # the policies' own sections are left out of a comparison
