"""The paper-scale preset: Mistral-7B's shape (no weights) on the committed roofline H200 cost model,
simulated on a virtual clock, at full-length trace prompts."""
import json
import subprocess
import sys
from pathlib import Path

from engine import CostModel
from engine.model.presets import SHAPE_PRESETS, hf_config

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(sys.executable).parent / "stallfree-bench"
COST_MODEL = ROOT / "benchmarks" / "cost_models" / "mistral-7b-h200-roofline.json"


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


def test_paper_preset_runs_a_full_length_point_on_the_7b_shape(tmp_path):
    args = ["+experiment=paper", "mode=run", "workload=arxiv", "slo=strict", "scheduler=sarathi",
            "chunk_size=512", "qps=4", "num_requests=60", f"results_dir={tmp_path}",
            f"model.cost_model={COST_MODEL}"]
    proc = subprocess.run([BENCH, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [summary_file] = (tmp_path / "paper").glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["model"] == "mistral-7b-shape" and "mistral-7b-shape" in SHAPE_PRESETS
    assert summary["completed"] == 60 and summary["failed"] == 0
    assert summary["disturbed"] is None  # a virtual clock does not depend on the CPU the run gets
    assert summary["total_input_tokens"] / 60 > 1000  # full-length arXiv prompts, not scaled down
