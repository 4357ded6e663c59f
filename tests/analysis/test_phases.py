"""analysis/phases: the tables and the token-budget helper on hand-made phases.csv rows, and the phases
notebook executed by stallfree-report on a tiny studies run."""
from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf

from stallfree.analysis import phases
from stallfree.analysis.report import build_report
from stallfree.loadgen.studies.table import COLUMNS, RUN_COLUMNS
from tests.helpers.notebooks import check_executed_notebook

RUN = {"model": "hand", "device": "test cpu", "dtype": "bfloat16", "peak_flops": 1e12, "bandwidth": 1e10}


def row(kind: str, seconds: float, *, prefill: int = 0, decodes: int = 0, chunk: int | None = None,
        prompt: int | None = None, repeat: int = 0, split: tuple | None = None) -> dict:
    linear, attention, other = split or (None, None, None)
    return {"study": "hand", "kind": kind, "repeat": repeat, "batch_size": decodes + bool(prefill),
            "prefill_tokens": prefill, "decode_tokens": decodes, "context_tokens": 0, "chunk_size": chunk,
            "prompt_tokens": prompt, "iteration_s": seconds, "per_token_ms": seconds * 1e3 / (prefill + decodes),
            "mfu": 0.5, "mbu": 0.1, "linear_s": linear, "attention_s": attention, "other_s": other,
            "model_flops": 1.0, "bytes_moved": 1.0, **RUN}


@pytest.fixture
def frame() -> pd.DataFrame:
    rows = [row("decode", 0.020, decodes=1), row("decode", 0.022, decodes=1, split=(0.015, 0.004, 0.003)),
            row("prefill", 0.160, prefill=512, chunk=512),
            row("hybrid", 0.040, prefill=127, decodes=1, chunk=128), row("hybrid", 0.050, prefill=124, decodes=4, chunk=128),
            row("hybrid", 0.090, prefill=252, decodes=4, chunk=256), row("hybrid", 0.170, prefill=508, decodes=4, chunk=512)]
    for repeat in (0, 1):
        rows += [row("chunk", 1.0, prefill=1024, chunk=1024, prompt=1024, repeat=repeat),
                 row("chunk", 0.55, prefill=512, chunk=512, prompt=1024, repeat=repeat),
                 row("chunk", 0.6, prefill=512, chunk=512, prompt=1024, repeat=repeat)]
    return pd.DataFrame(rows, columns=COLUMNS + RUN_COLUMNS).astype({"chunk_size": "Int64", "prompt_tokens": "Int64"})


def test_token_budget(frame):
    # the hybrids' P99 (8 decodes: as measured, decode-only steps give no per-decode cost here): 128 -> 49.9 ms,
    # 256 -> 90 ms, 512 -> 170 ms, linear in between; fitting SLO / (1 + margin)
    found = phases.token_budget(frame, 117, tile=128, decode_batch=8, margin=0.3)
    assert (found.chunk_size, found.predicted_ms, found.limit_ms) == (256, 90.0, pytest.approx(90.0))
    assert phases.token_budget(frame, 100, tile=128, decode_batch=8, margin=0.3).chunk_size == 128
    assert phases.token_budget(frame, 100, tile=128, decode_batch=8, margin=0.0).chunk_size == 256
    assert phases.token_budget(frame, 143, tile=64, decode_batch=8, margin=0.0).predicted_ms == pytest.approx(130.0)
    assert phases.token_budget(frame, 1000, tile=128, decode_batch=8).chunk_size == 512  # no extrapolation
    assert phases.token_budget(frame, 10, tile=128, decode_batch=8) is None


def test_token_budget_answers_for_the_tail_under_its_decode_batch(frame):
    """A chunk whose median iteration fits but whose slow iterations do not is not recommended; more decodes
    beside the chunk cost what the decode-only steps say a decode costs over a prefill token."""
    slow = [row("hybrid", seconds, prefill=252, decodes=4, chunk=256, repeat=i)
            for i, seconds in enumerate([0.050] * 9 + [0.120])]
    tail = pd.concat([frame, pd.DataFrame(slow, columns=frame.columns)], ignore_index=True)
    assert tail[tail.chunk_size == 256].iteration_s.median() * 1e3 == 50.0
    assert phases.hybrid_tail_ms(tail, 8)[256] > 100
    assert phases.token_budget(tail, 100, tile=128, decode_batch=8, margin=0.0).chunk_size == 128
    # decode-only steps: 21 ms at batch 1 (the median), 37 ms at batch 9 (2 ms a decode); prefill tokens cost nothing here
    costly = pd.concat([frame, pd.DataFrame([row("decode", 0.037, decodes=9)], columns=frame.columns)],
                       ignore_index=True)
    assert phases.decode_swap_s(costly) == pytest.approx(0.002)
    # the 256-token hybrid measured with 4 decodes (90 ms), predicted with 20: 16 more decodes, 32 ms more
    assert phases.hybrid_tail_ms(costly, 20)[256] == pytest.approx(122.0)


def test_budget_command(frame, tmp_path, capsys):
    frame.to_csv(tmp_path / "phases.csv", index=False)
    assert phases.budget_main([str(tmp_path), "--slo-tbt-ms", "117", "--decode-batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "chunk_size=256" in out and "P99 of 90.0 ms" in out and "30% margin" in out and "8 decodes" in out
    assert phases.budget_main([str(tmp_path), "--slo-tbt-ms", "100", "--margin", "0"]) == 0
    assert "chunk_size=256" in capsys.readouterr().out
    assert phases.budget_main([str(tmp_path), "--slo-tbt-ms", "10"]) == 1
    assert "the smallest measured, 128, predicts 49.9 ms" in capsys.readouterr().out
    assert phases.budget_main([str(tmp_path / "nothing"), "--slo-tbt-ms", "10"]) == 2
    assert "no phases.csv" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        phases.budget_main([str(tmp_path), "--slo-tbt-ms", "100", "--margin", "-0.1"])
    assert usage.value.code == 2
    markdown = phases.budget_table(frame, None, 128)  # 5x and 25x the unsampled batch-1 decode step (20 ms)
    assert "| 100.0 | 128 | 49.9 | 76.9 |" in markdown and "| 500.0 | 512 | 170.0 |" in markdown


def test_tables(frame):
    grid = phases.chunking_overhead(frame)
    assert grid.loc[1024, 512] == pytest.approx(1.15) and grid.loc[1024, 1024] == 1.0
    hybrid = phases.hybrid_vs_prefill(frame).set_index("chunk_size")
    assert hybrid.loc[512, "ratio"] == pytest.approx(170 / 160)
    split = phases.split_medians(frame).set_index("shape")
    assert split.loc["decode x1", "linear_s"] == 0.015 and split.loc["decode x1", "unsampled_s"] == 0.020
    assert phases.title(frame) == "hand on test cpu (bfloat16)"


@pytest.mark.slow
def test_report_includes_phases_notebook(tmp_path, tiny_path):
    from stallfree.engine.hydra_config import compose
    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.studies import run_study

    for experiment, overrides in (
            ("phases", ["study.decode_batch_sizes=[1,4]", "study.decode_context=16", "study.prefill_sizes=[16,32]",
                        "study.hybrid_chunk_sizes=[16,32]", "study.hybrid_decodes=[2]"]),
            ("chunking", ["study.prompt_lengths=[64]", "study.chunk_sizes=[16,32]"]),
            ("tiles", ["study.chunk_sizes=[15,16,17]"])):
        cfg = compose("bench", [f"+experiment={experiment}", "model=tiny", f"results_dir={tmp_path}",
                                "study.warmup=0", "study.repeats=2", *overrides], job_name="test")
        run_study(load_bench(OmegaConf.create(cfg)))
    report = build_report(tmp_path)
    check_executed_notebook(tmp_path, "phases")
    html = report.read_text()
    assert "Prefill, decode and hybrid iterations" in html and "Pareto" not in html  # no runs: no run sections


def test_figures_name_model_device_and_units(frame):
    from stallfree.analysis import phase_plots

    tiles = pd.DataFrame([row("tile", 0.05 + 0.01 * (n > 256), prefill=n, chunk=n) for n in (255, 256, 257)])
    frame = pd.concat([frame, tiles], ignore_index=True)
    for plot in (phase_plots.per_token_plot, phase_plots.split_plot, phase_plots.utilisation_plot,
                 phase_plots.chunking_plot, phase_plots.tiles_plot):
        fig = plot(frame)
        titles = [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes)]
        assert any("hand on test cpu (bfloat16)" in t for t in titles), plot.__name__
        axes = [ax for ax in fig.axes if ax.get_xlabel()]  # a colour bar has no x label
        assert axes and all("(" in ax.get_xlabel() for ax in axes), plot.__name__
        assert any("(" in ax.get_ylabel() for ax in axes), plot.__name__
