"""The target registry (one class per conf/target/<kind>.yaml, each a Target) and the in-process
replay, which reads the engine only through its public outputs."""
import inspect

import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.targets import TARGETS, Target, target_class
from stallfree.loadgen.targets.inprocess import TIMEOUT_ERROR, replay
from stallfree.loadgen.workload.request_specs import build_workload
from tests.helpers.paths import ROOT

KINDS = sorted(p.stem for p in (CONF_DIR / "target").glob("*.yaml"))


def test_every_target_config_has_a_class():
    assert KINDS == sorted(TARGETS) == ["http", "inprocess", "locust", "url"]


@pytest.mark.parametrize("kind", KINDS)
def test_target_class_implements_the_protocol(kind):
    cls = target_class(kind)
    for method in ("replay", "finalize", "close"):
        assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method}"
        protocol = inspect.signature(getattr(Target, method))
        assert list(inspect.signature(getattr(cls, method)).parameters) == list(protocol.parameters)
    assert list(inspect.signature(cls).parameters) == ["cfg", "log_dir"]


def test_unknown_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown target.kind 'carrier-pigeon'; choose one of http, inprocess"):
        target_class("carrier-pigeon")


@pytest.fixture(scope="module")
def tiny_engine():
    from stallfree.engine import LLMEngine

    return LLMEngine.from_kwargs(model="tiny", dtype="float32")


def test_inprocess_replay_records_ok_and_timed_out_requests(tiny_engine, tmp_path):
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 16, "output": 8}, 2, 0, 1000)
    seen = []
    done = replay(tiny_engine, specs, warmup=1, progress=seen.append)
    assert [(r.status, r.is_warmup, r.output_tokens) for r in done.records] == [("ok", True, 8), ("ok", False, 8)]
    assert sorted(r.request_id for r in seen) == [s.request_id for s in specs]
    for r in done.records:
        assert r.first_token_time == r.token_times[0] and r.finish_time == r.server_finish_time >= r.token_times[-1]
        assert r.server_token_times == r.token_times and r.num_preemptions == 0
    assert len(done.batches) >= 8 and not tiny_engine.has_unfinished()

    long = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 16, "output": 200}, 2, 1, 1000)
    timed_out = replay(tiny_engine, long, timeout_s=0.0).records
    assert [(r.status, r.error) for r in timed_out] == [("timeout", TIMEOUT_ERROR)] * 2
    assert all(0 < r.output_tokens < 200 and r.finish_time >= r.send_time for r in timed_out)
    assert not tiny_engine.has_unfinished()


def relative_times(records) -> list[tuple]:
    return [(r.first_token_time - r.intended_send_time, r.finish_time - r.intended_send_time,
             tuple(t - r.intended_send_time for t in r.token_times)) for r in records]


def test_a_simulated_replay_gives_the_same_times_whatever_the_virtual_clock_read_before(tmp_path):
    """Round cost-model coefficients and a constant 64 QPS end some iterations exactly as a request arrives: a
    reused engine, its clock started later, must admit that request as a fresh one does (in plain floats the
    last bits of the start decided it, and the rest of the schedule followed)."""
    from stallfree.engine import CostModel, LLMEngine

    cost_model = tmp_path / "round.json"
    CostModel(coefficients={"intercept": 0.004, "num_prefill_tokens": 5e-5, "num_decode_seqs": 5e-4}).save(cost_model)
    specs = build_workload({"kind": "constant", "qps": 64}, {"kind": "fixed", "prompt": 64, "output": 16}, 200, 0,
                           1000)
    runs = []
    for origin_runs in (0, 1):
        engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual", cost_model=str(cost_model))
        for _ in range(origin_runs):  # a run before moves the clock on, as the basic sweep launcher's reuse does
            replay(engine, specs[:7])
        runs.append(replay(engine, specs).records)
    assert runs[1][0].intended_send_time > runs[0][0].intended_send_time
    assert relative_times(runs[1]) == relative_times(runs[0])


def test_targets_package_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, loadgen.sweep.bench, loadgen.targets; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_inprocess_target_starts_each_run_on_an_empty_prefix_cache(tmp_path):
    """A sweep's runs replay the same prompts on one engine: the second would find them all cached."""
    from hydra import compose, initialize_config_dir

    from stallfree.loadgen.config.schema import load_bench
    from stallfree.loadgen.targets.inprocess import InProcessTarget

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = load_bench(compose("bench", ["model=tiny", "model.dtype=float32", "cache.enable_prefix_caching=true"]))
    target = InProcessTarget(cfg, tmp_path)
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 40, "output": 2}, 2, 0, 1000)
    for _ in range(2):
        done = target.replay(specs, warmup=0, progress=None)
        assert done.prefix_cache_reset == "reset"
        assert [r.cached_tokens for r in done.records] == [0, 0]
    target.engine.add_request(specs[0].prompt_token_ids + [5], request_id="again")
    while target.engine.has_unfinished():
        target.engine.step()
    assert target.engine.kv.num_hit_tokens == 32  # the cache was on: two 16-token blocks of the last run
    target.close()


def test_an_inprocess_cap_holds_requests_back_and_records_the_wait():
    """arrival.max_concurrency on the engine clock: never more than the cap added and unfinished, each held-back
    request arriving as one ends, with the same tokens as without the cap."""
    from stallfree.engine import LLMEngine
    from stallfree.engine.records.request_metrics import summarize
    from stallfree.loadgen.results.run_dir import requests_frame

    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 32, "output": 8}, 9, 0, 1000)
    free = replay(engine, specs).records
    capped = replay(engine, specs, max_concurrency=2).records
    assert [r.output_tokens for r in capped] == [r.output_tokens for r in free] == [8] * 9
    assert [r.client_wait_s for r in free] == [None] * 9
    assert capped[0].client_wait_s == capped[1].client_wait_s == 0.0
    ends = sorted(r.finish_time for r in capped)
    # the i-th held-back request arrives as the i-th of those before it ends
    assert [r.send_time for r in capped[2:]] == ends[:7]
    assert all(r.send_time - r.intended_send_time == r.client_wait_s > 0 for r in capped[2:])
    summary = summarize(requests_frame(capped))
    assert summary["peak_in_flight"] == 2 and summary["completed"] == 9
    assert summary["client_wait_max_ms"] == pytest.approx(capped[-1].client_wait_s * 1e3)


def test_inprocess_sessions_send_each_follow_up_after_the_turn_before():
    """Chat sessions on the engine's clock: a follow-up arrives its think time after the turn before ended, the
    history it resends is served from the prefix cache, and the summary has the per-session fields."""
    from stallfree.engine import LLMEngine
    from stallfree.engine.records.request_metrics import summarize
    from stallfree.engine.records.session_metrics import session_table
    from stallfree.loadgen.results.run_dir import requests_frame

    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual", enable_prefix_caching=True)
    specs = build_workload({"kind": "poisson", "qps": 4.0}, {"kind": "chat_sessions", "turns": 3, "user_len": 40,
                           "output_len": 8, "think_time_s": 0.5}, 12, 0, 1000)
    records = replay(engine, specs, max_concurrency=2).records
    assert all(r.status == "ok" for r in records)
    by_id = {r.request_id: r for r in records}
    for spec, record in zip(specs, records, strict=True):
        if spec.turn:
            before = by_id[specs[specs.index(spec) - 1].request_id]
            assert record.intended_send_time == pytest.approx(before.finish_time + spec.think_time_s)
            assert record.cached_tokens >= 32  # the history's full blocks
    summary = summarize(requests_frame(records))
    assert summary["num_sessions"] == summary["sessions_completed"] == 4
    assert summary["mean_turns_per_session"] == 3.0 and summary["peak_in_flight"] <= 2
    assert summary["median_ttft_follow_up_ms"] is not None and summary["median_ttft_first_turn_ms"] is not None
    table = session_table(requests_frame(records).assign(ttft_ms=1.0))
    assert list(table["turns"]) == [3] * 4 and set(table["session_end"]) == {"last_turn"}


def test_an_inprocess_session_ends_at_a_rejected_turn():
    from stallfree.engine import LLMEngine
    from stallfree.engine.records import NOT_SENT

    engine = LLMEngine.from_kwargs(model="tiny", runner="simulated", clock="virtual")
    specs = build_workload({"kind": "burst"}, {"kind": "chat_sessions", "turns": 3, "user_len": 50_000,
                           "output_len": 4}, 3, 0, 1000)  # past tiny's context
    records = replay(engine, specs).records
    assert records[0].status == "error" and "rejected by the engine" in records[0].error
    assert [r.error for r in records[1:]] == [f"{NOT_SENT}: turn 0 of its session ended error"] * 2
