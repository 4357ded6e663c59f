"""The report's conclusion (analysis.conclusion) on hand-made capacity searches and sweep runs: it names the
policy that wins, by how much, whether the difference beats the spread between repeats, what a lower bound
is, and whether disturbed runs change the ranking."""
import json

import pandas as pd
import pytest

from stallfree.analysis import capacity_ranking, conclusion, load

SLOS = {"strict": 100.0, "relaxed": 500.0}


def search(scheduler: str, chunk: int | None, repeats: list[float], slo: str = "strict", bracketed: bool = True,
           points: list[dict] | None = None) -> dict:
    """A capacity.json record as loadgen.sweep.capacity_search writes it."""
    mean = sum(repeats) / len(repeats)
    spread = (max(repeats) - min(repeats)) / 2
    lo = mean if mean > 0 else None
    return {"scheduler": scheduler, "chunk_size": chunk, "slo_name": slo, "slo_tbt_ms": SLOS[slo],
            "capacity_qps": mean, "capacity_ci_lo": mean - spread, "capacity_ci_hi": mean + spread,
            "capacity_qps_repeats": repeats, "bracketed": bracketed, "lo_qps": lo,
            "hi_qps": mean * 1.1 if bracketed and lo else None,
            "points": points or [{"qps": mean or 0.5, "passed": mean > 0, "run_id": f"{scheduler}-{mean:g}"}]}


def write_searches(exp_dir, records: list[dict]):
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "capacity.json").write_text(json.dumps(records))
    return exp_dir


def no_runs() -> pd.DataFrame:
    return pd.DataFrame(columns=["experiment", "run_id", "scheduler", "chunk_size", "qps", "config"])


def test_when_sarathi_loses_the_conclusion_says_so(tmp_path):
    exp = write_searches(tmp_path / "exp", [search("vllm", None, [3.8, 4.0, 4.2]),
                                            search("sarathi", 256, [1.9, 2.0, 2.1])])
    text = conclusion.conclusion_markdown(exp, no_runs(), {})
    assert "**vllm has the highest capacity**" in text and "sarathi has the highest" not in text
    assert "vllm reaches 2.00x sarathi-256's capacity" in text
    assert "larger than the spread between repeats (the 95% intervals do not overlap)" in text
    assert "Ranking: vllm 4 QPS (95% interval" in text and "over 3 repeats" in text


def test_a_difference_within_the_spread_or_of_one_repeat_is_not_claimed(tmp_path):
    overlapping = [search("sarathi", 256, [2.0, 3.0, 4.0]), search("vllm", None, [1.5, 2.5, 3.5])]
    text = conclusion.conclusion_markdown(write_searches(tmp_path / "a", overlapping), no_runs(), {})
    assert "not larger than the spread between repeats (the 95% intervals overlap)" in text
    single = [search("sarathi", 256, [3.0]), search("vllm", None, [1.5])]
    text = conclusion.conclusion_markdown(write_searches(tmp_path / "b", single), no_runs(), {})
    assert "with one repeat of sarathi-256 and vllm the run-to-run spread is unknown" in text


def test_lower_bounds_and_none_passed_are_written_as_bounds(tmp_path):
    records = [search("sarathi", 256, [4.0], bracketed=False), search("vllm", None, [0.0], bracketed=False,
                                                                        points=[{"qps": 0.5, "passed": False}])]
    text = conclusion.conclusion_markdown(write_searches(tmp_path / "exp", records), no_runs(), {})
    assert "sarathi-256 ≥ 4 QPS" in text and "vllm < 0.5 QPS (none passed)" in text
    assert "sarathi-256 reaches > 8.00x vllm's capacity" in text
    # a lower bound at or above the leader: no order, no ratio
    records = [search("sarathi", 256, [4.0]), search("vllm", None, [3.0], bracketed=False)]
    text = conclusion.conclusion_markdown(write_searches(tmp_path / "b", records), no_runs(), {})
    assert "vllm's capacity is a lower bound (≥ 3 QPS): its order against sarathi-256 is not established" in text
    assert "x vllm" not in text


def sweep(rows: list[tuple]) -> pd.DataFrame:
    """Sweep runs: (scheduler, chunk_size, qps, p99_tbt_ms, disturbed)."""
    frame = pd.DataFrame(rows, columns=["scheduler", "chunk_size", "qps", "p99_tbt_ms", "disturbed"])
    return load.label_configs(frame.assign(experiment="exp", run_id=[f"r{i}" for i in range(len(frame))],
                                           seed=0, median_scheduling_delay_ms=10.0))


def test_a_sweep_where_sarathi_loses_and_whether_disturbed_runs_change_it(tmp_path):
    runs = sweep([("vllm", None, 1.0, 50.0, False), ("vllm", None, 2.0, 90.0, False), ("vllm", None, 4.0, 400.0, False),
                  ("sarathi", 256, 1.0, 80.0, False), ("sarathi", 256, 2.0, 150.0, False),
                  ("sarathi", 256, 4.0, 300.0, False)])
    text = conclusion.conclusion_markdown(tmp_path, runs, SLOS)
    strict, relaxed = text.split("\n\n")[1:3]
    assert strict.startswith("**strict SLO (P99 TBT ≤ 100 ms), from the sweep's runs (no capacity search ran).**")
    assert "**vllm has the highest capacity**: vllm reaches 2.00x sarathi-256's capacity" in strict
    assert "vllm ≥ 4 QPS" in relaxed and "sarathi-256 ≥ 4 QPS" in relaxed  # the highest QPS tried passed
    assert "No run was disturbed." in strict
    assert "at 4 QPS: sarathi-256 300 ms (meets relaxed), vllm 400 ms (meets relaxed)" in text
    disturbed = runs.assign(disturbed=runs["run_id"] == "r5")  # sarathi's 4 QPS run: it fails anyway
    strict = conclusion.conclusion_markdown(tmp_path, disturbed, SLOS).split("\n\n")[1]
    assert "Disturbed runs (the engine, or a url run's load generator, got too little of the CPU it asked for): r5." in strict
    assert "Without them the ranking of the policies holds (vllm > sarathi)" in strict
    disturbed = runs.assign(disturbed=runs["run_id"] == "r1")  # vllm's only strict pass above 1 QPS
    strict = conclusion.conclusion_markdown(tmp_path, disturbed, SLOS).split("\n\n")[1]
    assert "**Without them the ranking changes**: vllm = sarathi (with them: vllm > sarathi)" in strict
    disturbed = runs.assign(disturbed=runs["run_id"].isin(["r0", "r1"]))
    strict = conclusion.conclusion_markdown(tmp_path, disturbed, SLOS).split("\n\n")[1]
    assert "**Without them the ranking changes**: sarathi > vllm (with them: vllm > sarathi)" in strict
    disturbed = runs.assign(disturbed=runs["run_id"].isin(["r0", "r1", "r2"]))  # every vllm run
    strict = conclusion.conclusion_markdown(tmp_path, disturbed, SLOS).split("\n\n")[1]
    assert "**Without them the ranking changes**: sarathi (vllm: every run disturbed) (with them: vllm > sarathi)" \
        in strict


def test_without_an_slo_it_says_no_capacity_search_ran_and_compares_p99_tbt(tmp_path):
    runs = sweep([("vllm", None, 1.0, 50.0, False), ("sarathi", 256, 1.0, 40.0, False)])
    text = conclusion.conclusion_markdown(tmp_path, runs, {})
    assert "No capacity search ran and there is no SLO to check the runs against." in text
    assert "at 1 QPS: sarathi-256 40 ms, vllm 50 ms" in text


@pytest.mark.parametrize("top, other, expected", [
    (capacity_ranking.Capacity("a", "a", 4.0, capacity_ranking.EXACT, 1.0), capacity_ranking.Capacity("b", "b", 2.0, capacity_ranking.EXACT, 1.0),
     "2.00x"),
    (capacity_ranking.Capacity("a", "a", 4.0, capacity_ranking.LOWER, 1.0), capacity_ranking.Capacity("b", "b", 2.0, capacity_ranking.EXACT, 1.0),
     "≥ 2.00x"),
    (capacity_ranking.Capacity("a", "a", 4.0, capacity_ranking.EXACT, 1.0), capacity_ranking.Capacity("b", "b", 2.0, capacity_ranking.LOWER, 1.0),
     None),
    (capacity_ranking.Capacity("a", "a", 0.0, capacity_ranking.BELOW, 1.0), capacity_ranking.Capacity("b", "b", 0.0, capacity_ranking.BELOW, 1.0),
     None),
])
def test_ratio_text_claims_only_what_the_bounds_support(top, other, expected):
    assert capacity_ranking.ratio_text(top, other) == expected


def test_a_server_that_served_prompts_from_its_prefix_cache_is_named_not_like_for_like():
    runs = pd.DataFrame({"config": ["vllm 0.32.0 (url)", "vllm 0.32.0 (url)", "stallfree sarathi-256"],
                         "server_prefix_cache_hit_rate": [0.86, 0.80, None]})
    note = conclusion.prefix_cache_note(runs)
    assert note.startswith("**Prefix cache**: vllm 0.32.0 (url) served 83% of its prompt tokens from its prefix cache")
    assert "stallfree" not in note and "--no-enable-prefix-caching" in note
    assert conclusion.prefix_cache_note(runs.assign(server_prefix_cache_hit_rate=[0.0, 0.01, None])) is None
    assert conclusion.prefix_cache_note(runs.drop(columns="server_prefix_cache_hit_rate")) is None


def test_engines_that_cached_prefixes_are_told_apart_from_those_that_did_not():
    runs = pd.DataFrame({"scheduler": ["sarathi", "sarathi", "vllm"], "chunk_size": [512, 512, None],
                         "prefix_caching": [False, True, None]})
    assert list(load.label_configs(runs)["config"]) == ["sarathi-512", "sarathi-512+prefix", "vllm"]
    assert conclusion._config({"scheduler": "vllm", "chunk_size": None, "prefix_caching": True}) == "vllm+prefix"
    assert conclusion._config({"scheduler": "sarathi", "chunk_size": 256}) == "sarathi-256"
