"""The stall comparison (analysis.stalls): runs picked at a load where every policy meets the relaxed SLO,
and a caption that says what the table's numbers say, whoever wins."""
import pandas as pd
import pytest

from stallfree.analysis import load, stalls
from tests.helpers.fakes.synthetic_results import write_synthetic_results


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pd.DataFrame:
    """SYNTHETIC runs: P99 TBT of vllm 11, 66, 175, 370 ms at 0.5, 1, 2, 4 QPS; sarathi-256 11-45 ms;
    sarathi-512 11-76 ms."""
    return load.load_runs(write_synthetic_results(tmp_path_factory.mktemp("stalls")))


@pytest.mark.parametrize("relaxed, picked", [
    (200.0, ["vllm-qps2", "sarathi-cs256-qps2"]),  # vllm misses 200 ms at 4 QPS; sarathi-256 is the lower
    (30.0, ["vllm-qps0.5", "sarathi-cs256-qps0.5"]),
])
def test_runs_are_picked_where_every_policy_meets_the_relaxed_slo(runs, relaxed, picked):
    chosen = stalls.representative_runs(runs, relaxed_slo_ms=relaxed)
    assert chosen["run_id"].tolist() == picked
    note = stalls.selection_note(runs, chosen, relaxed)
    assert f"highest QPS where every policy meets the relaxed SLO ({relaxed:.0f} ms)" in note


def test_without_such_a_qps_the_note_says_so(runs):
    chosen = stalls.representative_runs(runs, relaxed_slo_ms=5.0)
    assert chosen["run_id"].tolist() == ["vllm-qps4", "sarathi-cs512-qps4"]  # the highest QPS both ran
    note = stalls.selection_note(runs, chosen, 5.0)
    assert "**No QPS at which every policy meets the relaxed SLO (5 ms)**: vllm, sarathi-512 miss it here." in note


def stall_table(rows: list[tuple]) -> pd.DataFrame:
    columns = ["config", "qps", "iterations", "stall_iterations", "stall_time_pct", "p99_tbt_ms", "max_tbt_ms",
               "gaps_over_strict_pct"]
    return pd.DataFrame(rows, columns=columns)


def test_caption_follows_the_numbers_when_stall_free_batching_loses_on_some():
    table = stall_table([("vllm", 2.0, 500, 40, 20.0, 80.0, 101.0, 2.3),
                         ("sarathi-256", 2.0, 520, 0, 0.0, 60.0, 457.0, 4.1)])
    caption = stalls.stall_caption(table, "strict")
    assert ("**sarathi-256** @ 2 QPS: 0 of 520 iterations were decode stalls (0.0% of busy time), P99 TBT 60 ms, "
            "max 457 ms, 4.1% of token gaps over the strict SLO.") in caption
    assert "Lowest with sarathi-256: decode-stall time, P99 TBT." in caption
    assert "Lowest with vllm: max TBT, gaps over the strict SLO." in caption
    flipped = stall_table([("vllm", 2.0, 500, 40, 20.0, 50.0, 90.0, 1.0),
                           ("sarathi-256", 2.0, 520, 0, 0.0, 60.0, 457.0, 4.1)])
    assert "Lowest with vllm: P99 TBT, max TBT, gaps over the strict SLO." in stalls.stall_caption(flipped, "strict")


def test_caption_without_batch_records_or_gaps():
    table = stall_table([("vllm", 1.0, None, None, None, 80.0, 90.0, 0.0)]).drop(
        columns=["iterations", "stall_iterations", "stall_time_pct"])
    assert stalls.stall_caption(table, "strict") == ("**vllm** @ 1 QPS: P99 TBT 80 ms, max 90 ms, 0.0% of token gaps "
                                                     "over the strict SLO.")
    assert stalls.stall_caption(table.iloc[:0], "strict") == "No token gaps to compare."
