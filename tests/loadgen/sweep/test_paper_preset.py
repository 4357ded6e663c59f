"""The paper-scale presets: the Sarathi-Serve study on simulated GPU deployments (+experiment=paper), and
Mistral-7B's shape (no weights) on the committed roofline H200 cost model (model=mistral7b_sim)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stallfree.engine import CostModel
from stallfree.engine.hydra_config import compose
from stallfree.engine.model.presets import hf_config
from tests.helpers.paths import ROOT

BENCH = Path(sys.executable).parent / "stallfree-bench"
COST_MODEL = ROOT / "engine" / "simulator" / "fitting" / "cost_models" / "mistral-7b-h200-roofline.json"


def test_committed_roofline_cost_model_matches_the_shape_and_the_h200_limits():
    sys.path.insert(0, str(ROOT))
    from benchmarks.roofline_cost_model import H200, matmul_params

    model = CostModel.load(COST_MODEL)
    assert model.fitted_on["source"] == "roofline"
    shape = hf_config("mistral-7b-shape")
    assert model.fitted_on["model_shape"] == {k: shape[k] for k in model.fitted_on["model_shape"]}
    weight_s = (matmul_params(shape) + shape["vocab_size"] * shape["hidden_size"]) * 2 / (H200["bandwidth_tb_s"] * 1e12)
    assert 7.0e9 < matmul_params(shape) < 7.3e9
    # a decode step is the weights read once plus the host overhead; a 512-token chunk adds its matmuls
    assert model.coefficients["intercept"] == weight_s + 1e-3
    assert 10e-3 < 512 * model.coefficients["num_prefill_tokens"] < 20e-3


@pytest.mark.parametrize("model, slo, tbt_ms, chunk", [
    ("mistral7b_a100", "strict", 100, 512), ("yi34b_a100_tp2", "relaxed", 1000, 2048),
    ("llama2_70b_a40_tp4_pp2", "relaxed", 5000, 1536), ("falcon180b_a100_tp4_pp2", "strict", 1000, 512)])
def test_paper_preset_takes_each_deployments_slo_and_token_budget(model, slo, tbt_ms, chunk):
    cfg = compose("bench", ["+experiment=paper", f"model={model}", f"slo={slo}", "scheduler=sarathi"], "test")
    assert (cfg["slo"]["tbt_ms"], cfg["scheduler"]["chunk_size"], cfg["num_requests"]) == (tbt_ms, chunk, 2048)
    assert cfg["capacity"]["max_p50_scheduling_delay_s"] == 2.0
    assert cfg["workload"]["lengths"]["scale"] == 1 and cfg["workload"]["max_total_tokens"] == 8192
    params = yaml.safe_load((ROOT / "conf" / "experiment" / "paper.yaml").read_text())["hydra"]["sweeper"]["params"]
    assert params["scheduler"] == "vllm,orca,sarathi" and params["workload"] == "openchat_sharegpt4,arxiv"


@pytest.mark.slow
def test_paper_preset_runs_a_point_of_a_pipelined_deployment(tmp_path):
    pytest.importorskip("stallfree.engine.simulator.ops", reason="the operator cost model (engine/simulator/ops)")
    args = ["+experiment=paper", "mode=run", "model=llama2_70b_a40_tp4_pp2", "workload=openchat_sharegpt4",
            "slo=strict", "scheduler=sarathi", "qps=0.5", "num_requests=40", f"results_dir={tmp_path}"]
    proc = subprocess.run([BENCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [summary_file] = (tmp_path / "paper").glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["model"] == "llama2_70b_a40_tp4_pp2" and summary["completed"] == 40
    assert summary["chunk_size"] == 512 and summary["slo_tbt_ms"] == 1000
    assert summary["pipeline_stages"] == 2 and 0 < summary["pipeline_bubble_fraction"] < 1
    assert summary["total_input_tokens"] / 40 > 1000  # full-length openchat_sharegpt4 prompts
