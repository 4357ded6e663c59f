"""mode=tune (loadgen/sweep/tune.py, tune_grid.py, tune_report.py): the grid, the live plan, the answer, and a
whole tune with the capacity searches stood in for (the searches themselves: test_capacity_search.py)."""
import json

import pytest
from hydra import compose, initialize_config_dir

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.config.schema import load_bench
from stallfree.loadgen.sweep import tune as tune_module
from stallfree.loadgen.sweep.tune import live_seconds, plan_live
from stallfree.loadgen.sweep.tune_grid import Setting, grid, simulated
from stallfree.loadgen.sweep.tune_report import TuneRow, answer


def bench(tmp_path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return load_bench(compose("bench", ["+experiment=tune", f"results_dir={tmp_path}", *overrides]))


def test_the_grid_crosses_chunked_policies_with_chunk_sizes_and_holds_the_configs_own(tmp_path):
    cfg = bench(tmp_path, "scheduler=orca", "tune.policies=[vllm,sarathi]", "tune.chunk_sizes=[256,512]",
                "tune.max_num_seqs=[8,64]")
    settings = grid(cfg, cfg.tune)
    assert Setting("orca", None, 128) in settings  # the config's own
    assert {s for s in settings if s.policy == "vllm"} == {Setting("vllm", None, 8), Setting("vllm", None, 64)}
    assert {(s.chunk_size, s.max_num_seqs) for s in settings if s.policy == "sarathi"} == {
        (256, 8), (256, 64), (512, 8), (512, 64)}
    assert len(settings) == 7
    applied = Setting("sarathi", 256, 8).apply(cfg)
    assert (applied.scheduler.policy, applied.scheduler.chunk_size, applied.scheduler.max_num_seqs) == \
        ("sarathi", 256, 8)


def test_the_simulated_config_runs_in_process_on_a_virtual_clock_in_its_own_experiment(tmp_path):
    cfg = bench(tmp_path, "target=http", "tune.cost_model=small-cpu.json")
    sim = simulated(cfg, cfg.tune)
    assert (sim.model.runner, sim.model.clock, sim.target.kind) == ("simulated", "virtual", "inprocess")
    assert sim.model.cost_model == "small-cpu.json" and sim.experiment_name == "tune-simulated"
    assert sim.scheduler == cfg.scheduler


def record(capacity: float, points: list[tuple[float, int, bool]], bound: str = "exact",
           repeats: list[float] | None = None) -> dict:
    return {"capacity_qps": capacity, "capacity_bound": bound, "capacity_display": f"{capacity:.3g} qps",
            "capacity_ci_lo": capacity * 0.9, "capacity_ci_hi": capacity * 1.1,
            "capacity_qps_repeats": repeats or [capacity],
            "points": [{"qps": q, "num_requests": n, "passed": ok, "p99_tbt_ms": 40.0, "run_id": f"r{q}"}
                       for q, n, ok in points]}


def test_the_live_plan_measures_the_own_setting_then_the_best_and_drops_what_does_not_fit():
    own, a, b, c = Setting("vllm", None, 128), Setting("sarathi", 256, 128), Setting("sarathi", 512, 128), \
        Setting("sarathi", 1024, 128)
    ranked = [(b, record(4.0, [(2.0, 60, True), (4.0, 120, True)])),  # 30 + 30 s of arrivals
              (a, record(3.0, [(2.0, 600, True)])),  # 300 s
              (c, record(2.0, [(2.0, 60, True)])),
              (own, record(1.0, [(1.0, 30, True)]))]
    assert live_seconds(ranked[0][1], repeats=2) == 120.0
    assert plan_live(ranked, own, confirm=2, repeats=1, max_minutes=None) == ([own, b, a], [])
    assert plan_live(ranked, own, confirm=2, repeats=1, max_minutes=2) == ([own, b], [a])


def run_summary(run_id: str) -> dict:
    qps = float(run_id[1:])
    return {"p99_tbt_ms": 40.0, "median_ttft_ms": 100 * qps, "p99_ttft_ms": 300 * qps}


def rows(measured: dict[Setting, dict | None], simulated: dict[Setting, float], own: Setting) -> list[TuneRow]:
    ranked = sorted(simulated, key=lambda s: -simulated[s])
    return [TuneRow.of(s, rank, record(simulated[s], []), measured.get(s), False, s == own, run_summary)
            for rank, s in enumerate(ranked, start=1)]


def test_the_answer_is_the_best_measured_setting_against_the_default_with_the_disagreements():
    own, a, b = Setting("vllm", None, 128), Setting("sarathi", 256, 128), Setting("sarathi", 512, 128)
    table = rows({own: record(1.0, [(1.0, 30, True)]), b: record(3.0, [(3.0, 90, True), (4.0, 120, False)]),
                  a: record(2.0, [(2.0, 60, True)])}, {own: 1.0, a: 4.0, b: 3.5}, own)
    result = answer(table)
    assert result["recommendation"] == b.label and result["confirmed"]
    assert result["answer"] == "sarathi, chunk 512, max_num_seqs 128: capacity 3 qps, 3x the default " \
                               "(vllm, max_num_seqs 128)"
    assert result["disagreements"] == ["simulated sarathi, chunk 256, max_num_seqs 128 > sarathi, chunk 512, "
                                       "max_num_seqs 128, measured 2 qps < 3 qps"]
    best = next(r for r in table if r.setting == b)
    assert (best.measured_run_id, best.p99_tbt_ms, best.median_ttft_ms) == ("r3.0", 40.0, 300.0)  # the best pass


def test_a_gain_within_the_searchs_tolerance_is_not_told_apart_from_the_default():
    own, b = Setting("sarathi", 512, 128), Setting("sarathi", 2048, 128)
    table = rows({own: record(3.125, [(3.125, 90, True)]), b: record(3.25, [(3.25, 90, True)])},
                 {own: 3.125, b: 3.25}, own)
    assert answer(table, tolerance=0.05)["answer"] == (
        "sarathi, chunk 2048, max_num_seqs 128: capacity 3.25 qps, 1.04x the default (sarathi, chunk 512, "
        "max_num_seqs 128), within the search's resolution (capacity.tolerance=0.05): not told apart from it")
    assert answer(table, tolerance=0.02)["answer"].endswith("1.04x the default (sarathi, chunk 512, max_num_seqs 128)")


def test_an_answer_with_repeats_gives_its_interval_and_one_nothing_passed_says_so():
    own = Setting("sarathi", 512, 128)
    good = answer(rows({own: record(3.0, [(3.0, 9, True)], repeats=[2.9, 3.1])}, {own: 3.0}, own))
    assert good["answer"] == ("sarathi, chunk 512, max_num_seqs 128: capacity 3 qps (2.7-3.3), the config's own "
                              "setting (no measured setting beat it)")
    none = answer(rows({own: record(0.0, [(0.125, 9, False)], bound="upper")}, {own: 0.0}, own))
    assert none["recommendation"] is None and none["answer"].startswith("no setting met the SLO")
    unconfirmed = answer(rows({}, {own: 3.0}, own))
    assert not unconfirmed["confirmed"] and "NOT confirmed live" in unconfirmed["answer"]


def stand_in(monkeypatch, search) -> None:
    """The tune's capacity searches, run summaries and SLO stood in for (``search`` takes the config)."""
    monkeypatch.setattr(tune_module, "run_search", search)
    monkeypatch.setattr(tune_module, "read_summary", lambda path: type("Summary", (), {
        "flat": lambda self: run_summary(path.parent.name)})())
    monkeypatch.setattr(tune_module, "resolve_slo", lambda cfg, exp_dir, targets: {
        "slo_name": "strict", "slo_tbt_ms": 50.0, "decode_iter_ms": 10.0, "slo_reference_method": "probe"})


def test_a_tune_searches_every_setting_simulated_the_best_live_and_writes_its_answer(tmp_path, monkeypatch):
    simulated_capacity = {("vllm", None): 1.0, ("sarathi", 256): 2.0, ("sarathi", 512): 3.0}
    searched = []

    def fake_search(cfg, targets):
        sc = cfg.scheduler
        key = (sc.policy, sc.chunk_size if sc.policy == "sarathi" else None)
        live = cfg.model.runner == "model"
        searched.append((key, live, cfg.slo.reference_ms))
        capacity = simulated_capacity[key] * (0.5 if live and key == ("sarathi", 512) else 1.0)
        return record(capacity, [(capacity, 30, True)])

    stand_in(monkeypatch, fake_search)
    cfg = bench(tmp_path, "scheduler=vllm", "tune.chunk_sizes=[256,512]", "tune.confirm=1")
    result = tune_module.run_tune(cfg, targets=None)
    simulated_keys = [k for k, live, _ in searched if not live]
    assert sorted(simulated_keys, key=str) == sorted(simulated_capacity, key=str)
    assert [k for k, live, _ in searched if live] == [("vllm", None), ("sarathi", 512)]  # own, then the best
    assert {ref for _, _, ref in searched} == {10.0}  # one pinned SLO reference for every search
    assert result["recommendation"] == "sarathi, chunk 512, max_num_seqs 128"
    assert result["answer"].endswith("1.5x the default (vllm, max_num_seqs 128)")
    assert json.loads((tmp_path / "tune" / "tune.json").read_text()) == result
    markdown = (tmp_path / "tune" / "tune.md").read_text()
    assert f"**{result['answer']}**" in markdown and "P99 TBT <= 50 ms, probe decode reference 10 ms" in markdown
    assert "| sarathi, chunk 256, max_num_seqs 128 | 2 | 2 qps | not measured |  |  |" in markdown
    assert "| sarathi, chunk 512, max_num_seqs 128 | 1 | 3 qps | 1.5 qps | 150 / 450 | 40 |" in markdown


def stand_in_searches(monkeypatch, refused: set[str]):
    """run_search standing in: the policies in ``refused`` fail as the engine refuses them (in process, a
    ConfigError naming the key), the others reach 1 qps."""
    def fake_search(cfg, targets):
        if cfg.scheduler.policy in refused:
            raise ConfigError("engine: scheduler.max_num_batched_tokens (4096) must be >= max_model_len (8192)")
        return record(1.0, [(1.0, 30, True)])

    stand_in(monkeypatch, fake_search)


def test_a_setting_the_engine_refuses_is_a_failed_row_and_the_tune_goes_on(tmp_path, monkeypatch):
    stand_in_searches(monkeypatch, refused={"vllm"})
    result = tune_module.run_tune(bench(tmp_path, "scheduler=vllm", "tune.chunk_sizes=[512]"), targets=None)
    rows = {row["label"]: row for row in result["settings"]}
    assert rows["vllm, max_num_seqs 128"]["status"] == "failed"
    assert "max_num_batched_tokens (4096)" in rows["vllm, max_num_seqs 128"]["reason"]
    assert rows["sarathi, chunk 512, max_num_seqs 128"]["status"] == "measured"
    assert result["recommendation"] == "sarathi, chunk 512, max_num_seqs 128"


def test_a_config_every_setting_refuses_is_a_config_error(tmp_path, monkeypatch):
    stand_in_searches(monkeypatch, refused={"vllm", "sarathi"})
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        tune_module.run_tune(bench(tmp_path, "tune.chunk_sizes=[512]"), targets=None)


@pytest.mark.parametrize(("override", "message"), [
    ("tune.policies=[nope]", "tune.policies must be a non-empty list of"),
    ("tune.chunk_sizes=[0]", "tune.chunk_sizes must be a non-empty list of integers >= 1"),
    ("tune.confirm=-1", "tune.confirm must be an integer >= 0"),
    ("tune.max_minutes=0", "tune.max_minutes must be a number > 0 or null"),
    ("target=locust", "target must be inprocess or http in mode=tune"),
    ("tune.serve_cmd='serve --flag {chunk_size}'", "tune.serve_cmd must be a command with {port}"),
    ("tune.serve_cmd='serve --port {port} --policy {policy}'", r"not \['policy'\]"),
    ("tune.serve_cmd='serve --port {port} --seqs {max_num_seqs}'", "tune.max_num_seqs must be a list"),
    ("tune.serve_cmd='serve --port {port'", "tune.serve_cmd must be a command template"),
    ("tune.serve_cmd='serve --port {port}'", "target must be url with tune.serve_cmd"),
])
def test_a_bad_tune_setting_names_its_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        bench(tmp_path, override)


def test_mode_tune_needs_the_tune_group(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigError, match="mode must be 'tune' only with"):
            load_bench(compose("bench", ["mode=tune", f"results_dir={tmp_path}"]))

