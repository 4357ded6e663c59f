"""The paper study's tables (analysis.paper) on hand-written capacity searches and run summaries."""
import json
import re

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


def reduce(results, num_requests: int = 256):
    """The study at ``num_requests`` per probe (the preset runs paper.PAPER_NUM_REQUESTS)."""
    runs = pd.read_parquet(results / "summary.parquet")
    runs.assign(num_requests=num_requests).to_parquet(results / "summary.parquet")
    return results


def test_the_preset_size_is_the_presets():
    import yaml

    from stallfree.engine.hydra_config import CONF_DIR

    preset = yaml.safe_load((CONF_DIR / "experiment" / "paper.yaml").read_text())
    assert preset["num_requests"] == paper.PAPER_NUM_REQUESTS


def test_a_reduced_study_carries_its_caveat_beside_every_ratio(results):
    from stallfree.analysis import conclusion, paper_plots

    assert paper.size_caveat(paper.study_sizes(results)) is None
    assert "Study size: 2,048 requests per probe, the preset's full size." in conclusion.paper_conclusion(results)
    reduce(results)
    sizes = paper.study_sizes(results)
    assert paper.size_text(sizes) == "256 requests per probe"
    text = conclusion.paper_conclusion(results)
    assert "**Study size: † reduced study: 256 requests per probe, not the preset's 2,048" in text
    assert "[256]" not in text
    ratios = re.findall(r"\d\.\d\dx( †)?", text)
    assert ratios and all(ratios)  # every ratio is followed by the mark
    assert "mistral7b_a100 over vllm: 2.00x † (arxiv, strict) vs the paper's 2.6x" in text
    head = paper.headline(paper.capacity_table(results))
    assert set(paper.with_study_size(head, sizes)["study"]) == {"† 256 requests per probe"}
    figure = paper_plots.headline_bars(head, caveat=paper.size_caveat(sizes))
    labels = [t.get_text() for t in figure.axes[0].texts]
    assert "2.0×†" in labels and figure._supxlabel.get_text().startswith("† reduced study")


def test_a_study_of_unknown_size_carries_a_caveat_too():
    assert paper.size_caveat([]).startswith("study size unknown")
    assert paper.size_text([256, 2048]) == "256 and 2,048 requests per probe"


def test_a_lower_bound_capacity_gives_no_ratio_over_it(results):
    records = json.loads((results / "capacity.json").read_text())
    for record in records:
        if record["model"] == "mistral7b_a100" and record["scheduler"] == "vllm":
            record.update(bracketed=False, hi_qps=None)
    (results / "capacity.json").write_text(json.dumps(records))
    table = paper.capacity_table(results)
    mistral = table[table["deployment"] == "mistral7b_a100"].set_index(["trace", "policy"])
    assert mistral.loc[("arxiv", "vllm"), "lower_bound"] and not mistral.loc[("arxiv", "sarathi"), "lower_bound"]
    assert pd.isna(mistral.loc[("arxiv", "sarathi"), "ratio_to_vllm"])  # vllm >= 1 QPS: 2 QPS is no 2x
    assert mistral.loc[("arxiv", "sarathi"), "ratio_to_orca"] == 4.0


@pytest.mark.slow
def test_report_of_a_reduced_study_shows_what_ran(tmp_path):
    """One deployment at 256 requests per probe: no Falcon TP8, ablation or bubbles sections (a line each says
    why), no NaN, the caveat beside the ratios."""
    from stallfree.analysis import report

    records = [search("mistral7b_a100", "arxiv", "strict", s, c, f"r-{s}")
               for s, c in (("vllm", 1.0), ("orca", 0.5), ("sarathi", 5.33))]
    (tmp_path / "capacity.json").write_text(json.dumps(records))
    pd.DataFrame([{"run_id": f"r-{s}", "model": "mistral7b_a100", "workload": "arxiv", "scheduler": s, "qps": 1.0,
                   "capacity_search": "strict", "p99_tbt_ms": 90.0, "median_ttft_ms": 300.0, "num_requests": 256,
                   "pipeline_stages": 1} for s in ("vllm", "orca", "sarathi")]).to_parquet(tmp_path / "summary.parquet")
    assert report.main([str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert html.index('id="Conclusion"') < html.index(report.SECTIONS["paper"].replace(" ", "-"))
    for section in ("Falcon-180B on two 4-GPU nodes: TP8 across them vs TP4-PP2", "Scheduling ablation",
                    "Pipeline bubbles"):
        assert f"{section}: left out, no " in html and f">{section}</h2>" not in html
    assert "NaN" not in html and "[256]" not in html
    assert "256 requests per probe" in html and "5.33x † (arxiv, strict) vs the paper's 2.6x" in html
    assert (tmp_path / "conclusion.md").read_text().startswith("# Conclusion")


def test_falcon_tp8_ratio_over_a_lower_bound_is_not_given(results):
    records = json.loads((results / "capacity.json").read_text())
    for record in records:
        if record["model"] == "falcon180b_a100_tp8" and record["workload"] == "openchat_sharegpt4":
            record.update(bracketed=False, hi_qps=None)
        if record["model"] == "falcon180b_a100_tp4_pp2" and record["scheduler"] == "sarathi":
            record.update(bracketed=False, hi_qps=None)
    (results / "capacity.json").write_text(json.dumps(records))
    table = paper.capacity_table(results)
    tp8 = paper.falcon_tp8(table).set_index("trace")
    assert tp8.loc["arxiv", "sarathi_tp4_pp2_over_vllm_tp8"] == pytest.approx(2.5)
    assert tp8.loc["arxiv", "ratio_lower_bound"]
    assert pd.isna(tp8.loc["openchat_sharegpt4", "sarathi_tp4_pp2_over_vllm_tp8"])
    head = paper.headline(table).set_index(["deployment", "over"])
    assert head.loc[("falcon180b_a100_tp4_pp2", "vllm at TP8"), "ours_lower_bound"]
