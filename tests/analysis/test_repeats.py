"""Repeats: the 95% interval of the mean, per-point summaries, and the intervals and disturbed runs in the
Pareto and capacity figures."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from stallfree.analysis import capacity, load, plots
from stallfree.analysis.repeats import repeat_summary
from stallfree.engine.records.repeat_stats import mean_interval


def test_interval_is_students_t():
    interval = mean_interval([1.0, 2.0, 3.0, np.nan])
    lo, hi = stats.t.interval(0.95, 2, loc=2.0, scale=1.0 / np.sqrt(3))
    assert (interval.mean, interval.n) == (2.0, 3)
    assert (interval.lo, interval.hi) == (pytest.approx(lo), pytest.approx(hi))
    assert (mean_interval([5.0]).lo, mean_interval([5.0]).hi) == (5.0, 5.0)
    assert np.isnan(mean_interval([]).mean)


def test_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    trials = [mean_interval(rng.normal(10.0, 3.0, 5)) for _ in range(4000)]
    coverage = np.mean([t.lo <= 10.0 <= t.hi for t in trials])
    assert coverage == pytest.approx(0.95, abs=0.012)


def _repeated_runs() -> pd.DataFrame:
    rows = []
    for scheduler, base in (("vllm", 100.0), ("sarathi", 120.0)):
        for qps in (1.0, 2.0):
            for seed in range(3):
                rows.append({"experiment": "exp", "run_id": f"{scheduler},qps={qps},seed={seed}",
                             "scheduler": scheduler, "chunk_size": 256 if scheduler == "sarathi" else None,
                             "qps": qps, "seed": seed, "point_id": f"{scheduler},qps={qps}",
                             "output_throughput": base * qps + seed, "p99_tbt_ms": 50.0 * qps + 2 * seed,
                             "disturbed": scheduler == "vllm" and qps == 2.0 and seed == 1})
    return load.label_configs(pd.DataFrame(rows))


def test_repeat_summary_gives_mean_and_interval_per_point():
    summary = repeat_summary(_repeated_runs(), ["output_throughput", "p99_tbt_ms"])
    assert len(summary) == 4 and (summary["n_repeats"] == 3).all()
    first = summary.iloc[0]
    assert first["output_throughput"] == pytest.approx(101.0)
    expected = mean_interval([100.0, 101.0, 102.0])
    assert (first["output_throughput_ci_lo"], first["output_throughput_ci_hi"]) == (
        pytest.approx(expected.lo), pytest.approx(expected.hi))
    disturbed = summary[summary["disturbed"]]
    assert disturbed["disturbed_runs"].tolist() == [["vllm,qps=2.0,seed=1"]]


def test_runs_without_point_id_are_their_own_points():
    runs = _repeated_runs().drop(columns=["point_id", "disturbed"])
    summary = repeat_summary(runs, ["p99_tbt_ms"])
    assert len(summary) == len(runs) and (summary["n_repeats"] == 1).all() and not summary["disturbed"].any()


def test_pareto_plot_draws_intervals_and_hollow_named_disturbed_runs():
    fig = plots.pareto_plot(_repeated_runs(), "p99_tbt_ms")
    ax = fig.axes[0]
    assert len(ax.containers) == 4  # one error bar per repeated point
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "vllm,qps=2.0,seed=1" in texts and "disturbed" in texts
    hollow = [c for c in ax.collections
              if len(c.get_offsets()) and len(c.get_facecolors()) and np.allclose(c.get_facecolors()[0], 1.0)]
    assert len(hollow) == 1 and len(hollow[0].get_offsets()) == 1


def test_capacity_plot_draws_the_interval_of_a_repeated_search():
    table = load.label_configs(pd.DataFrame({
        "experiment": "exp", "scheduler": ["vllm", "sarathi"], "chunk_size": [None, 256], "slo_name": "strict",
        "slo_tbt_ms": 100.0, "source": "capacity.json", "capacity_qps": [2.0, 3.0], "capacity_bound": "exact",
        "capacity_display": ["2", "3"], "capacity_ci_lo": [1.5, np.nan], "capacity_ci_hi": [2.5, np.nan],
        "ratio_to_vllm": [1.0, 1.5]}))
    ax = plots.capacity_plot(table).axes[0]
    [bars] = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    segments = bars.lines[2][0].get_segments()
    assert len(segments) == 1 and np.allclose(segments[0][:, 1], [1.5, 2.5])


def test_pareto_legend_names_the_dtype_of_the_runs():
    legend = plots.pareto_plot(_repeated_runs().assign(dtype="bfloat16"), "p99_tbt_ms").axes[0].get_legend()
    assert legend.get_title().get_text() == "dtype: bfloat16"
    untold = plots.pareto_plot(_repeated_runs(), "p99_tbt_ms").axes[0].get_legend()  # runs from before the field
    assert untold.get_title().get_text() == ""


def test_capacity_plot_labels_a_bound_as_a_bound(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    points = [{"qps": 4.0, "passed": True}, {"qps": 8.0, "passed": True}]
    (exp / "capacity.json").write_text(json.dumps([
        {"scheduler": "vllm", "chunk_size": None, "slo_name": "strict", "slo_tbt_ms": 100.0, "capacity_qps": 8.0,
         "capacity_bound": "lower", "points": points},
        {"scheduler": "sarathi", "chunk_size": 256, "slo_name": "strict", "slo_tbt_ms": 100.0, "capacity_qps": 0.0,
         "bracketed": False, "lo_qps": None, "hi_qps": 4.0, "points": [{"qps": 4.0, "passed": False}]}]))
    table = capacity.capacity_table(tmp_path, pd.DataFrame(columns=["experiment"]), {})
    labels = [t.get_text() for t in plots.capacity_plot(table).axes[0].texts]
    assert labels == [">= 8\n(the highest rate tried)", "< 4\n(the lowest rate tried)"]
    assert table["ratio_to_vllm"].isna().all()
