"""benchmarks/gpu.py, the GPU's first-run acceptance script: its ``--smoke`` mode runs the same code path
on the CPU (the full run needs a GPU), and its arithmetic on known figures."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.lib.gpu_checks import SMOKE_SHAPE, TARGETS, judge
from benchmarks.lib.gpu_iterations import parameter_counts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_run_passes_on_cpu_and_writes_every_verdict(tmp_path):
    out = tmp_path / "gpu_smoke.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--smoke", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["smoke"] and result["verdict"] == "PASS"
    assert result["greedy_vs_hf"]["equal"] and result["greedy_vs_hf"]["prompts"] == 6
    assert result["serving_path"]["attention_backend"] in ("CPUPagedAttention", "SDPAAttention")
    assert [name for name, _, _ in TARGETS] == list(result["targets"])
    assert {t["verdict"] for t in result["targets"].values()} <= {"PASS", "FAIL"}  # every figure measured
    assert "greedy vs HF (fp32): PASS" in proc.stdout and "attention backend: " in proc.stdout
    assert result["tp2_vs_tp1"] == {"skipped": "needs 2 GPUs, this machine has 0"}  # the CPU smoke run
    assert "TP2 vs TP1 greedy (fp32): SKIPPED (needs 2 GPUs, this machine has 0)" in proc.stdout
    assert result["pp2_vs_pp1"] == {"skipped": "needs 2 GPUs, this machine has 0"}
    assert "PP2 vs PP1 greedy (fp32): SKIPPED (needs 2 GPUs, this machine has 0)" in proc.stdout


def test_parameter_counts_match_the_hf_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    from stallfree.engine.model.arch import ArchConfig
    config = LlamaConfig(**SMOKE_SHAPE, tie_word_embeddings=False)
    hf = LlamaForCausalLM(config)
    linears = sum(p.numel() for n, p in hf.named_parameters() if "proj" in n)
    cfg = ArchConfig.from_dict({**config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    assert parameter_counts(cfg) == (linears, hf.lm_head.weight.numel())


def test_judge_gives_pass_fail_and_skip():
    verdicts = judge({"decode_b1_ms": 5.9, "decode_b64_ms": 9.5, "prefill_512_mfu": 0.5,
                      "offline_sarathi_over_hf_continuous_batching": None})
    assert verdicts["decode_b1_ms"] == {"value": 5.9, "target": "<= 6.0", "verdict": "PASS"}
    assert verdicts["decode_b64_ms"]["verdict"] == "FAIL"
    assert verdicts["prefill_512_mfu"]["verdict"] == "PASS"  # the limit itself passes
    assert verdicts["offline_sarathi_over_hf_continuous_batching"]["verdict"] == "SKIP"
    assert verdicts["hybrid_over_prefill_512"]["verdict"] == "SKIP"


@pytest.mark.slow
def test_diagnose_smoke_run_splits_the_run_by_phase(tmp_path):
    out = tmp_path / "gpu_diagnosis.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--smoke", "--diagnose", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    diagnosis = json.loads(out.read_text())["diagnosis"]
    assert set(diagnosis["offline_tok_s"]) == {"sarathi_512", "sarathi_1024", "sarathi_2048", "vllm_4096"}
    assert diagnosis["over_vllm"]["vllm_4096"] == 1.0
    profile = diagnosis["sarathi_512_profile_32_requests_64_tokens"]
    assert {"schedule", "prepare_host_batch", "to_device", "forward", "sample", "update_from_output"} <= set(
        profile["phases"])
    assert profile["phases"]["forward"]["calls"] >= 64 and profile["phases"]["forward"]["host_ms"] > 0
