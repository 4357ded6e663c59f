"""loadgen/studies: the iterations the driver asks the real scheduler for are the ones it gets (on ``tiny``),
and a study writes phases.csv with its schema."""
from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf

from stallfree.engine import LLMEngine
from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import compose
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.studies import run_study
from stallfree.loadgen.studies.catalog import check_study
from stallfree.loadgen.studies.driver import IterationDriver
from stallfree.loadgen.studies.table import COLUMNS, RUN_COLUMNS
from tests.helpers.fakes.machine_limits import fake_machine_limits


@pytest.fixture(scope="module")
def driver(tiny_path):
    engine = LLMEngine.from_kwargs(model=str(tiny_path), scheduler="sarathi", op_split_every=2)
    return IterationDriver(engine, warmup=1, repeats=2)


def test_decode_batches(driver):
    batches = driver.decode_batches([4, 1], context=20)
    assert list(batches) == [1, 4]
    for size, records in batches.items():
        assert len(records) == 2
        for r in records:
            assert (r.num_decode_seqs, r.num_prefill_tokens) == (size, 0)
            assert 20 <= r.decode_context_tokens / size <= 26  # the batch grows at the running requests' context
    assert not driver.engine.has_unfinished()


def test_prefill_and_hybrid(driver):
    prefills = driver.prefill(50)
    assert [(r.num_prefill_tokens, r.num_prefill_seqs, r.num_decode_seqs) for r in prefills] == [(50, 1, 0)] * 2
    hybrids = driver.hybrid(32, decodes=3, context=20)
    assert [(r.num_prefill_tokens, r.num_prefill_seqs, r.num_decode_seqs) for r in hybrids] == [(29, 1, 3)] * 2
    assert not driver.engine.has_unfinished()


def test_chunked_prefill(driver):
    passes = driver.chunked_prefill(100, 32)
    assert [[r.num_prefill_tokens for r in records] for records in passes] == [[32, 32, 32, 4]] * 2
    assert [r.prefill_attention_work for r in passes[0]] == [32 * 32, 32 * 64, 32 * 96, 4 * 100]


def test_check_study_names_the_key():
    good = {"name": "tiles", "warmup": 0, "repeats": 1, "chunk_sizes": [8]}
    check_study(good)
    with pytest.raises(ConfigError, match="study.chunk_sizes"):
        check_study({**good, "chunk_sizes": [0]})
    with pytest.raises(ConfigError, match="study.name"):
        check_study({**good, "name": "nope"})
    with pytest.raises(ConfigError, match="study.hybrid_decodes"):
        check_study({"name": "phases", "warmup": 0, "repeats": 1, "decode_batch_sizes": [1], "decode_context": 8,
                     "prefill_sizes": [8], "hybrid_chunk_sizes": [8], "hybrid_decodes": [8]})


def test_studies_write_phases_csv(tmp_path, tiny_path):
    def run(experiment: str, *overrides: str):
        cfg = compose("bench", [f"+experiment={experiment}", "model=tiny", f"results_dir={tmp_path}",
                                "study.warmup=0", "study.repeats=1", *overrides], job_name="test")
        return run_study(load_bench(OmegaConf.create(cfg)))

    with fake_machine_limits():
        run("phases", "study.decode_batch_sizes=[1,2]", "study.decode_context=16", "study.prefill_sizes=[16,5000]",
            "study.hybrid_chunk_sizes=[16]", "study.hybrid_decodes=[2]")
        run("tiles", "study.chunk_sizes=[15,16,17]")
        path = run("chunking", "study.prompt_lengths=[40]", "study.chunk_sizes=[16,64]")
    frame = pd.read_csv(path)
    assert list(frame.columns) == COLUMNS + RUN_COLUMNS
    assert frame.groupby("study").kind.unique().map(sorted).to_dict() == {
        "phases": ["decode", "hybrid", "prefill"], "tiles": ["tile"], "chunking": ["chunk"]}
    prefill = frame[frame.kind == "prefill"]
    assert sorted(prefill.prefill_tokens) == [16, 2047]  # 5000 capped at tiny's max_model_len - 1
    chunks = frame[frame.kind == "chunk"].groupby("chunk_size").prefill_tokens.apply(list).to_dict()
    assert chunks == {16: [16, 16, 8], 40: [40]}
    assert (frame.per_token_ms > 0).all() and frame.mfu.notna().all() and (frame.model == "tiny").all()
    run("tiles", "study.chunk_sizes=[15]")  # a rerun replaces its own study's rows only
    again = pd.read_csv(path)
    assert len(again[again.study == "tiles"]) == 1 and len(again[again.study == "chunking"]) == 4


def test_studies_run_unchanged_on_a_simulated_deployment(tmp_path):
    """model=mistral7b_sim: the same presets on the simulated runner (virtual clock, a committed cost model)."""
    cfg = compose("bench", ["+experiment=phases", "model=mistral7b_sim", f"results_dir={tmp_path}",
                            "study.decode_batch_sizes=[1,8]", "study.prefill_sizes=[512,16384]",
                            "study.hybrid_chunk_sizes=[512]", "study.hybrid_decodes=[4]"], job_name="test")
    frame = pd.read_csv(run_study(load_bench(OmegaConf.create(cfg))))
    assert sorted(frame.kind.unique()) == ["decode", "hybrid", "prefill"]
    assert sorted(frame[frame.kind == "prefill"].prefill_tokens.unique()) == [512, 8191]  # the shape's limit
    assert (frame.iteration_s > 0).all() and (frame.model == "mistral-7b-shape").all()


@pytest.mark.parametrize("model", ["mistral7b_a100", "llama2_70b_a40_tp4_pp2", "falcon180b_a100_tp8"])
def test_studies_run_on_the_papers_deployments(tmp_path, model):
    """A GPU deployment (one with pipeline stages too): the iterations run one at a time, with MFU / MBU
    against the GPUs' published peaks and the operator split from the operator cost model."""
    def run(experiment: str, *overrides: str) -> pd.DataFrame:
        cfg = compose("bench", [f"+experiment={experiment}", f"model={model}", f"results_dir={tmp_path}",
                                "study.warmup=0", "study.repeats=1", *overrides], job_name="test")
        return pd.read_csv(run_study(load_bench(OmegaConf.create(cfg))))

    run("phases", "study.decode_batch_sizes=[1,8]", "study.prefill_sizes=[512]", "study.hybrid_chunk_sizes=[512]",
        "study.hybrid_decodes=[4]")
    frame = run("chunking", "study.prompt_lengths=[1024]", "study.chunk_sizes=[256]")
    assert sorted(frame.kind.unique()) == ["chunk", "decode", "hybrid", "prefill"]
    assert frame.mfu.between(0, 1).all() and frame.mbu.between(0, 1).all()
    assert frame.device.str.contains("x").all() and (frame.peak_flops > 1e14).all()
    split = frame.dropna(subset=["linear_s"])
    assert len(split) and (split.linear_s > 0).all() and (split.attention_s > 0).all() and (split.other_s >= 0).all()
    prefill = frame[frame.kind == "prefill"].iloc[0]
    assert prefill.mfu > frame[frame.kind == "decode"].mfu.max()  # prefill is compute-bound, decode is not
