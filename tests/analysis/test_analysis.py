"""analysis/: Pareto and capacity math on constructed data; loading, notebooks and the report on the
SYNTHETIC results set of tests/helpers/fakes/synthetic_results.py (a stand-in until an end-to-end `tiny` sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stallfree.analysis import capacity, load, pareto, report, stalls
from tests.helpers.fakes.synthetic_results import write_synthetic_results
from tests.helpers.notebooks import FIGURES, check_executed_notebook


def _runs(rows: list[tuple]) -> pd.DataFrame:
    """Constructed runs: (scheduler, chunk_size, qps, p99_tbt_ms, median_scheduling_delay_ms)."""
    frame = pd.DataFrame(rows, columns=["scheduler", "chunk_size", "qps", "p99_tbt_ms",
                                        "median_scheduling_delay_ms"])
    return load.label_configs(frame.assign(experiment="exp", run_id=[f"r{i}" for i in range(len(frame))]))


# --- Pareto -----------------------------------------------------------------------------------------

def test_pareto_front_excludes_dominated_points():
    points = pd.DataFrame({"p99_tbt_ms": [10, 20, 30, 25, 40, 15],
                           "output_throughput": [100, 200, 300, 150, 300, 100],
                           "scheduler": "vllm"})
    front = pareto.pareto_front(points)
    # (25, 150) is dominated by (20, 200); (40, 300) by (30, 300); (15, 100) by (10, 100).
    assert front.index.tolist() == [0, 1, 2]
    assert front["p99_tbt_ms"].is_monotonic_increasing


def test_pareto_front_keeps_exact_ties_and_drops_missing_values():
    points = pd.DataFrame({"p99_tbt_ms": [10, 10, 10, 20, np.nan],
                           "output_throughput": [100, 100, 90, 200, 999],
                           "scheduler": "sarathi"})
    front = pareto.pareto_front(points)
    assert front.index.tolist() == [0, 1, 3]  # both equal points kept, in input order; NaN row left out


def test_pareto_front_is_per_group():
    points = pd.DataFrame({"scheduler": ["vllm", "vllm", "sarathi", "sarathi"],
                           "p99_tbt_ms": [100, 200, 10, 20],
                           "output_throughput": [50, 60, 10, 5]})
    per_policy = pareto.pareto_front(points)
    assert sorted(per_policy.index) == [0, 1, 2]  # vllm's points are not dominated by sarathi's
    assert pareto.pareto_front(points, by=()).index.tolist() == [2, 0, 1]
    assert pareto.pareto_front(points.iloc[:0]).empty


# --- capacity ---------------------------------------------------------------------------------------

def test_capacity_from_sweep_runs():
    runs = _runs([("vllm", None, 1.0, 40, 10), ("vllm", None, 2.0, 80, 10), ("vllm", None, 4.0, 300, 10),
                  ("sarathi", 512, 1.0, 30, 10), ("sarathi", 512, 2.0, 35, 10),
                  ("sarathi", 512, 4.0, 45, 2500),  # meets the TBT SLO, but queues too long
                  ("sarathi", 256, 1.0, 200, 10)])  # never meets the strict SLO
    table = capacity.capacity_table("/nonexistent", runs, {"strict": 50.0, "relaxed": 250.0})
    got = {(r.config, r.slo_name): (r.capacity_qps, r.ratio_to_vllm) for r in table.itertuples()}
    shown = {(r.config, r.slo_name): (r.capacity_bound, r.capacity_display) for r in table.itertuples()}
    assert got[("vllm", "strict")] == (1.0, 1.0)
    assert got[("sarathi-512", "strict")] == (2.0, 2.0)
    assert got[("vllm", "relaxed")] == (2.0, 1.0)
    # bounds, not numbers: below the only QPS tried, at least the only QPS tried; no ratio from a bound
    assert got[("sarathi-256", "strict")][0] == 0.0 and np.isnan(got[("sarathi-256", "strict")][1])
    assert shown[("sarathi-256", "strict")] == ("upper", "< 1 (the lowest rate tried)")
    assert got[("sarathi-256", "relaxed")][0] == 1.0 and np.isnan(got[("sarathi-256", "relaxed")][1])
    assert shown[("sarathi-256", "relaxed")] == ("lower", ">= 1 (the highest rate tried)")
    assert shown[("sarathi-512", "strict")] == ("exact", "2")
    assert table["chunk_size"][table["scheduler"] == "vllm"].isna().all()  # vllm does not chunk
    assert table["slo_name"].tolist()[:3] == ["strict"] * 3  # strictest first
    assert set(table["source"]) == {"sweep"}


def test_a_sweep_run_that_fell_behind_does_not_pass():
    runs = _runs([("sarathi", 512, 1.0, 30, 10), ("sarathi", 512, 2.0, 35, 10)])
    runs = runs.assign(completion_ratio=[0.99, 0.6])  # at 2 QPS the server completed 60% of the offered rate
    table = capacity.capacity_table("/nonexistent", runs, {"strict": 50.0})
    assert table[["capacity_qps", "capacity_bound"]].values.tolist() == [[1.0, "exact"]]


def test_capacity_from_search_probes_and_without_baseline():
    runs = _runs([("sarathi", 512, 1.0, 30, 10), ("sarathi", 512, 3.0, 90, 10),
                  ("sarathi", 512, 2.0, 60, 10)])
    runs = runs.assign(capacity_search="strict", slo_tbt_ms=70.0)
    table = capacity.capacity_table("/nonexistent", runs, {"other": 1.0})
    assert table[["slo_name", "slo_tbt_ms", "capacity_qps", "source"]].values.tolist() == [
        ["strict", 70.0, 2.0, "capacity search"]]
    assert table["ratio_to_vllm"].isna().all()
    assert "No `vllm` capacity" in capacity.capacity_note(table)


def test_capacity_json_wins_over_runs(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    strict = {"slo_name": "strict", "slo_tbt_ms": 50}
    (exp / "capacity.json").write_text(json.dumps([
        {"scheduler": "vllm", "chunk_size": None, **strict, "capacity_qps": 1.5},
        {"scheduler": "sarathi", "chunk_size": 512, **strict, "capacity_qps": 3.0}]))
    runs = _runs([("vllm", None, 8.0, 1.0, 1.0)])
    table = capacity.capacity_table(tmp_path, runs, {"strict": 50.0})
    assert table[["config", "capacity_qps", "ratio_to_vllm"]].values.tolist() == [
        ["vllm", 1.5, 1.0], ["sarathi-512", 3.0, 2.0]]
    assert "from capacity.json" in capacity.capacity_note(table)


def test_slo_levels():
    runs = pd.DataFrame({"slo_tbt_ms": [100.0, 100.0]})
    batches = pd.DataFrame({"iteration_ms": [10.0, 12.0, 14.0, 500.0], "kind": ["decode"] * 3 + ["prefill"]})
    assert capacity.slo_levels(runs, batches) == {"strict": 60.0, "relaxed": 300.0}
    assert capacity.slo_levels(runs, batches, strict_ms=40.0) == {"strict": 40.0, "relaxed": 300.0}
    assert capacity.slo_levels(runs) == {"configured": 100.0}
    assert capacity.slo_levels(runs.iloc[:0]) == {}


# --- loading the synthetic set ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory) -> object:
    root = tmp_path_factory.mktemp("results")
    write_synthetic_results(root)
    return root


def test_load_runs(results):
    runs = load.load_runs(results)
    assert len(runs) == 12
    assert runs["config"].unique().tolist() == ["vllm", "sarathi-256", "sarathi-512"]
    assert runs["chunk_size"].dtype == "Int64" and runs["qps"].dtype == float
    assert runs.groupby("qps")["p99_tbt_ms"].apply(lambda g: g.iloc[0] >= g.iloc[1:].min()).all()
    assert load.load_runs(results / "synthetic").equals(runs)
    one = load.load_runs(results / "synthetic" / "vllm-qps2")
    assert one["run_id"].tolist() == ["vllm-qps2"]
    assert "No runs for policies: orca" in load.coverage_note(runs)


def test_load_runs_falls_back_to_summary_parquet(results, tmp_path):
    (tmp_path / "only_summary").mkdir()
    (tmp_path / "only_summary" / "summary.parquet").write_bytes(
        (results / "synthetic" / "summary.parquet").read_bytes())
    runs = load.load_runs(tmp_path)
    assert len(runs) == 12 and runs["run_dir"].isna().all()
    assert load.load_requests(runs).empty


def test_load_requests_and_token_gaps(results):
    runs = load.load_runs(results)
    requests = load.load_requests(runs)
    everything = load.load_requests(runs, measured_only=False)
    assert len(everything) - len(requests) == 2 * len(runs)  # one warmup and one failed request per run
    assert (requests["ttft_ms"] > 0).all() and (requests["e2e_ms"] >= requests["ttft_ms"]).all()
    assert requests["tpot_ms"].between(5, 500).all()
    gaps = load.token_gaps(requests)
    assert len(gaps) == int((requests["output_tokens"] - 1).sum())
    assert (gaps["tbt_ms"] > 0).all() and gaps["token_index"].min() == 1
    # TBT pooled per token, like the summary's p99_tbt_ms
    p99 = gaps.groupby("run_id")["tbt_ms"].quantile(0.99)
    assert np.allclose(p99[runs["run_id"]].to_numpy(), runs["p99_tbt_ms"].to_numpy())


def test_load_batches(results):
    batches = load.load_batches(results)
    assert (batches["iteration_ms"] > 0).all()
    stalled = batches.groupby("scheduler")["decode_stall"].sum()
    assert stalled["vllm"] > 0 and stalled["sarathi"] == 0  # prefill-only iterations stall vllm's decodes
    assert set(batches["kind"][batches["scheduler"] == "sarathi"]) <= {"decode", "hybrid", "prefill"}


def test_load_missing_and_empty(tmp_path):
    with pytest.raises(FileNotFoundError):
        load.load_runs(tmp_path / "missing")
    runs = load.load_runs(tmp_path)
    assert runs.empty and {"p99_tbt_ms", "config", "run_dir"} <= set(runs.columns)
    assert load.load_requests(runs).empty and load.load_batches(runs).empty
    assert "No runs found" in load.coverage_note(runs)


def test_stall_selection(results):
    runs = load.load_runs(results)
    chosen = stalls.representative_runs(runs)
    assert chosen["run_id"].tolist() == ["vllm-qps4", "sarathi-cs512-qps4"]
    assert stalls.representative_runs(runs, qps=1.0, chunk_size=256)["run_id"].tolist() == [
        "vllm-qps1", "sarathi-cs256-qps1"]
    followed = stalls.long_requests(load.token_gaps(load.load_requests(chosen)), n=3)
    assert followed.groupby("run_id")["request_id"].nunique().tolist() == [3, 3]


# --- notebooks and report ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(results) -> object:
    assert report.main([str(results)]) == 0
    return results


@pytest.mark.parametrize("name", list(FIGURES))
@pytest.mark.slow
def test_notebook_executes_and_saves_figures(built, name):
    check_executed_notebook(built, name)


@pytest.mark.slow
def test_report_has_three_sections(built):
    html = (built / "report.html").read_text()
    for title in (report.SECTIONS[name] for name in report.GENERIC_SECTIONS):
        assert f'<h1 id="{title.replace(" ", "-")}">{title}' in html
    assert html.count("data:image/png") >= sum(map(len, FIGURES.values()))
    assert html.index('<h1 id="Conclusion">') < html.index('<h1 id="Pareto-frontiers">')
    assert "Lowest with sarathi-256: decode-stall time, P99 TBT" in html  # the stall caption, from its table


@pytest.mark.slow
def test_report_with_missing_policy_and_batches(tmp_path, capsys):
    write_synthetic_results(tmp_path, configs=(("sarathi", 512),), qps=(1.0, 2.0), duration_s=8.0,
                            with_batches=False)
    assert report.main([str(tmp_path)]) == 0
    assert "report.html" in capsys.readouterr().out
    html = (tmp_path / "report.html").read_text()
    assert "ratios to vllm are not available" in html and "No runs for policies: vllm" in html
    assert all((tmp_path / "figures" / f).is_file() for figures in FIGURES.values() for f in figures)


def test_report_missing_dir(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "results directory not found" in err and "Traceback" not in err


def test_report_in_headless_chromium(built):
    """The report as a browser shows it: every section and figure renders, tables have no index column
    and no <NA>, and nothing runs off the page (wide tables scroll in their own box)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[dev]')")
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("needs Chromium at /usr/bin/chromium")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((built / "report.html").resolve().as_uri())
        for name in report.GENERIC_SECTIONS:  # a sweep's report (the paper section is for make paper alone)
            assert page.get_by_role("heading", name=report.SECTIONS[name]).first.is_visible()
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])")
        assert images and all(done and width > 0 for done, width in images)
        tables = page.locator("table.stallfree-table")
        assert tables.count() >= 2
        assert "<NA>" not in page.inner_text("body") and "NaN" not in page.inner_text("body")
        for i in range(tables.count()):
            first_header = tables.nth(i).locator("thead th").first.inner_text().strip()
            assert first_header, "an index column has an empty header"
            overflow = tables.nth(i).evaluate("t => getComputedStyle(t.parentElement).overflowX")
            assert overflow == "auto"
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert not errors, errors
        browser.close()
