"""The paper study's tables (analysis.paper) on hand-written capacity searches and run summaries."""
import json

import pandas as pd
import pytest

from stallfree.analysis import paper


def search(model, workload, slo, scheduler, capacity, run_id):
    return {"model": model, "workload": workload, "slo_name": slo, "slo_tbt_ms": 100.0, "scheduler": scheduler,
            "chunk_size": 512 if scheduler == "sarathi" else None, "capacity_qps": capacity, "bracketed": True,
            "lo_qps": capacity, "hi_qps": capacity * 1.1,
            "points": [{"qps": capacity, "passed": True, "run_id": run_id}]}


@pytest.fixture
def results(tmp_path):
    records, runs = [], []
    capacities = {("mistral7b_a100", "vllm"): 1.0, ("mistral7b_a100", "orca"): 0.5, ("mistral7b_a100", "sarathi"): 2.0,
                  ("falcon180b_a100_tp4_pp2", "vllm"): 0.2, ("falcon180b_a100_tp4_pp2", "sarathi"): 1.0,
                  ("falcon180b_a100_tp8", "vllm"): 0.4}
    for (model, scheduler), capacity in capacities.items():
        for workload, scale in (("arxiv", 1.0), ("openchat_sharegpt4", 1.5)):
            run_id = f"{model}-{workload}-{scheduler}"
            records.append(search(model, workload, "strict", scheduler, capacity * scale, run_id))
            runs.append({"run_id": run_id, "model": model, "workload": workload, "scheduler": scheduler,
                         "qps": capacity * scale, "capacity_search": "strict", "p99_tbt_ms": 90.0,
                         "median_ttft_ms": 300.0, "median_scheduling_delay_ms": 50.0, "num_requests": 2048,
                         "pipeline_stages": 2 if "pp2" in model else 1,
                         "pipeline_bubble_fraction": {"vllm": 0.3, "sarathi": 0.1}.get(scheduler, 0.2)})
    for scheduler, ttft in (("hybrid", 900.0), ("chunked_prefill", 400.0), ("sarathi", 500.0)):
        runs.append({"run_id": f"ablation-{scheduler}", "model": "yi34b_a100_tp2", "workload": "arxiv",
                     "scheduler": scheduler, "qps": 1.0, "capacity_search": None, "p99_tbt_ms": 100.0,
                     "median_ttft_ms": ttft, "num_requests": 2048})
    (tmp_path / "capacity.json").write_text(json.dumps(records))
    pd.DataFrame(runs).to_parquet(tmp_path / "summary.parquet")
    return tmp_path


def test_capacity_table_has_a_row_per_search_with_its_ratios(results):
    table = paper.capacity_table(results)
    assert len(table) == 12 and list(table.columns) == paper.TABLE_COLUMNS
    row = table[(table["deployment"] == "mistral7b_a100") & (table["trace"] == "arxiv")
                & (table["policy"] == "sarathi")].iloc[0]
    assert (row["ratio_to_vllm"], row["ratio_to_orca"], row["median_ttft_ms"]) == (2.0, 4.0, 300.0)
    assert paper.write_capacity_table(results).read_text().startswith("deployment,trace,slo,policy,")


def test_headline_puts_the_papers_ratios_beside_the_best_of_ours(results):
    head = paper.headline(paper.capacity_table(results)).set_index(["deployment", "over"])
    assert head.loc[("mistral7b_a100", "vllm"), "paper"] == 2.6
    assert head.loc[("mistral7b_a100", "vllm"), "ours"] == pytest.approx(2.0)
    assert head.loc[("falcon180b_a100_tp4_pp2", "vllm"), "ours"] == pytest.approx(5.0)
    assert head.loc[("falcon180b_a100_tp4_pp2", "vllm at TP8"), "ours"] == pytest.approx(2.5)
    assert pd.isna(head.loc[("yi34b_a100_tp2", "vllm"), "ours"])  # no searches of it


def test_ablation_and_bubbles(results):
    ablation = paper.ablation(results)
    assert list(ablation["policy"]) == ["hybrid", "chunked_prefill", "sarathi"]
    assert list(ablation["median_ttft_ms"]) == [900.0, 400.0, 500.0]
    bubbles = paper.bubbles(results).set_index("policy")
    assert bubbles.loc["sarathi", "median_bubble_fraction"] < bubbles.loc["vllm", "median_bubble_fraction"]
    assert set(bubbles["deployment"]) == {"falcon180b_a100_tp4_pp2"}


@pytest.mark.slow
def test_report_of_the_study_is_its_section_alone(results):
    from stallfree.analysis import report

    assert report.main([str(results)]) == 0
    html = (results / "report.html").read_text()
    assert report.SECTIONS["paper"] in html and report.SECTIONS["pareto"] not in html
    assert (results / "capacity_table.csv").is_file()
    assert {p.name for p in (results / "figures").glob("*.png")} == {"paper_capacity.png", "paper_headline.png"}
