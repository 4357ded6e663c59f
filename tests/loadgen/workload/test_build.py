import csv
import itertools

import numpy as np
import pytest
from scipy import stats

from stallfree.loadgen.workload.request_specs import TRACES_DIR, build_workload, clip_lengths, gamma, poisson

FIXED = {"kind": "fixed", "prompt": 4, "output": 2}


def trace_rows(name: str, n: int) -> list[dict]:
    with open(TRACES_DIR / f"{name}.csv") as f:
        return list(itertools.islice(csv.DictReader(f), n))


def offsets(arrival: dict, n: int, seed: int = 0) -> np.ndarray:
    return np.array([s.send_offset_s for s in build_workload(arrival, FIXED, n, seed, vocab_size=100)])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("qps", [0.5, 4.0, 200.0])
def test_poisson_gaps_are_exponential(seed, qps):
    gaps = np.diff(offsets({"kind": "poisson", "qps": qps}, 2000, seed))
    assert stats.kstest(gaps, "expon", args=(0, 1 / qps)).pvalue > 0.01
    assert gaps.mean() == pytest.approx(1 / qps, rel=0.1)


@pytest.mark.parametrize("cv", [0.5, 2.0, 3.0])
def test_gamma_matches_rate_and_cv(cv):
    gaps = np.diff(gamma(np.random.default_rng(0), 50_000, qps=10.0, cv=cv))
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_constant_and_burst():
    assert offsets({"kind": "constant", "qps": 4}, 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert offsets({"kind": "burst"}, 3).tolist() == [0.0, 0.0, 0.0]
    assert poisson(np.random.default_rng(0), 1, qps=1.0).tolist() == [0.0]


def test_trace_replay_reproduces_recorded_times():
    recorded = np.array([float(row["arrived_at"]) for row in trace_rows("azure_conv", 50)])
    got = offsets({"kind": "trace", "time_scale": 0.25}, 50)
    np.testing.assert_allclose(got, (recorded - recorded[0]) * 0.25)


def test_trace_lengths_in_file_order_are_scaled_and_rounded():
    rows = trace_rows("azure_conv", 20)
    specs = build_workload({"kind": "burst"}, {"kind": "trace", "name": "azure_conv", "scale": 4, "shuffle": False},
                           20, 0, vocab_size=1000)
    for spec, row in zip(specs, rows, strict=True):
        assert len(spec.prompt_token_ids) == max(1, round(int(row["num_prefill_tokens"]) / 4))
        assert spec.max_tokens == max(1, round(int(row["num_decode_tokens"]) / 4))


def test_prompts_have_exact_length_and_token_range():
    specs = build_workload({"kind": "burst"}, {"kind": "uniform", "prompt_lo": 1, "prompt_hi": 50,
                                               "output_lo": 1, "output_hi": 5}, 200, 3, vocab_size=64)
    tokens = np.concatenate([s.prompt_token_ids for s in specs])
    assert tokens.min() >= 10 and tokens.max() < 64
    assert {len(s.prompt_token_ids) for s in specs} == set(range(1, 51))
    assert {s.max_tokens for s in specs} == set(range(1, 6))
    assert len({s.request_id for s in specs}) == 200


def test_zipf_favours_short_requests():
    specs = build_workload({"kind": "burst"}, {"kind": "zipf", "prompt_lo": 10, "prompt_hi": 1000,
                                               "output_lo": 1, "output_hi": 100, "alpha": 1.2}, 2000, 0, 1000)
    prompts = np.array([len(s.prompt_token_ids) for s in specs])
    assert prompts.min() >= 10 and prompts.max() <= 1000
    assert np.median(prompts) < 60 < prompts.max()  # heavy tail, mass near the lower bound


def test_same_seed_same_workload_and_rate_changes_keep_requests():
    args = ({"kind": "trace", "name": "arxiv_summarization", "scale": 8}, 100)
    a = build_workload({"kind": "poisson", "qps": 2}, *args, seed=7, vocab_size=32000, max_total_tokens=512)
    b = build_workload({"kind": "poisson", "qps": 2}, *args, seed=7, vocab_size=32000, max_total_tokens=512)
    c = build_workload({"kind": "poisson", "qps": 8}, *args, seed=7, vocab_size=32000, max_total_tokens=512)
    d = build_workload({"kind": "poisson", "qps": 2}, *args, seed=8, vocab_size=32000, max_total_tokens=512)
    assert a == b
    assert [(s.prompt_token_ids, s.max_tokens) for s in a] == [(s.prompt_token_ids, s.max_tokens) for s in c]
    assert [s.send_offset_s for s in c] == pytest.approx([s.send_offset_s / 4 for s in a])
    assert a != d


def test_clipping_keeps_prefill_decode_ratio():
    prompt, output = clip_lengths(np.array([3000, 1, 10_000, 50, 399]), np.array([1000, 10_000, 1, 50, 1]), 400)
    assert prompt.tolist() == [300, 1, 399, 50, 399]
    assert output.tolist() == [100, 399, 1, 50, 1]


def test_clipping_trace_lengths_to_max_total():
    specs = build_workload({"kind": "burst"}, {"kind": "trace", "name": "arxiv_summarization", "scale": 1,
                                               "shuffle": False}, 500, 0, 32000, max_total_tokens=256)
    rows = trace_rows("arxiv_summarization", 500)
    for spec, row in zip(specs, rows, strict=True):
        p, d = len(spec.prompt_token_ids), spec.max_tokens
        p0, d0 = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
        assert p >= 1 and d >= 1 and p + d == min(256, p0 + d0)
        assert p / (p + d) == pytest.approx(p0 / (p0 + d0), abs=1 / 256)


@pytest.mark.parametrize(("arrival", "lengths", "message"), [
    ({"kind": "poisson", "qps": -1}, FIXED, "arrival.qps must be > 0, got -1"),
    ({"kind": "poisson", "qps": 0}, FIXED, "arrival.qps must be > 0"),
    ({"kind": "gamma", "qps": 1, "cv": 0}, FIXED, "arrival.cv must be > 0"),
    ({"kind": "constant"}, FIXED, "arrival.qps is required"),
    ({"kind": "poisson", "qsp": 1}, FIXED, "arrival.qsp is not a setting"),
    ({"kind": "weibull", "qps": 1}, FIXED, "arrival.kind must be one of"),
    ({"qps": 1}, FIXED, "arrival.kind must be one of"),
    ({"kind": "trace", "time_scale": -2}, FIXED, "arrival.time_scale must be > 0"),
    ({"kind": "trace", "name": "arxiv_summarization"}, FIXED, "arrival.name must be a trace with an arrived_at"),
    ({"kind": "burst"}, {"kind": "trace", "name": "no_such_trace"}, "lengths.name: trace name 'no_such_trace'"),
    ({"kind": "burst"}, {"kind": "trace", "name": "azure_conv", "scale": 0}, "lengths.scale must be > 0"),
    ({"kind": "burst"}, {"kind": "fixed", "prompt": 0, "output": 1}, "lengths.prompt must be an integer >= 1"),
    ({"kind": "burst"}, {"kind": "fixed", "prompt": 2.5, "output": 1}, "lengths.prompt must be an integer"),
    ({"kind": "burst"}, {"kind": "uniform", "prompt_lo": 5, "prompt_hi": 4, "output_lo": 1, "output_hi": 1},
     "lengths.prompt_hi must be an integer >= prompt_lo"),
    ({"kind": "burst"}, {"kind": "zipf", "prompt_lo": 1, "prompt_hi": 4, "output_lo": 1, "output_hi": 1,
                         "alpha": 0}, "lengths.alpha must be > 0"),
    ({"kind": "burst"}, {"kind": "lognormal"}, "lengths.kind must be one of"),
])
def test_bad_config_names_the_key(arrival, lengths, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        build_workload(arrival, lengths, 10, 0, vocab_size=100)


def test_bad_builder_arguments_name_the_key():
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        build_workload({"kind": "burst"}, FIXED, 0, 0, vocab_size=100)
    with pytest.raises(ValueError, match="max_total_tokens must be >= 2"):
        build_workload({"kind": "burst"}, FIXED, 1, 0, vocab_size=100, max_total_tokens=1)
    with pytest.raises(ValueError, match="vocab_size must be > low_token_id"):
        build_workload({"kind": "burst"}, FIXED, 1, 0, vocab_size=10)
    with pytest.raises(ValueError, match="num_requests must be <= the 19366 rows"):
        build_workload({"kind": "trace"}, FIXED, 20_000, 0, vocab_size=100)


def test_random_lengths_and_burstiness_as_vllm_bench_serve():
    from stallfree.loadgen.workload.request_specs import build_workload

    specs = build_workload({"kind": "burst"}, {"kind": "random", "input_len": 100, "output_len": 20,
                                               "range_ratio": 0.5}, 2000, 0, 32000)
    prompts = np.array([len(s.prompt_token_ids) for s in specs])
    outputs = np.array([s.max_tokens for s in specs])
    assert (prompts.min(), prompts.max(), outputs.min(), outputs.max()) == (50, 150, 10, 30)
    assert abs(prompts.mean() - 100) < 3
    arrivals = build_workload({"kind": "gamma", "qps": 10.0, "cv": 9.0, "burstiness": 0.25},
                              {"kind": "fixed", "prompt": 4, "output": 2}, 4000, 0, 32000)
    gaps = np.diff([s.send_offset_s for s in arrivals])
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.2  # burstiness 0.25: cv 2, whatever cv says
