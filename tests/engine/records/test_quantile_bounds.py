"""The P99's confidence interval from order statistics: it holds the true quantile as often as it claims, and
says None where the samples are too few to bound it."""
import numpy as np
import pytest

from stallfree.engine.records.quantile_bounds import p99_tbt_evidence, prefill_gaps, quantile_interval
from tests.helpers.batch_records import example_batch_record


def test_the_interval_covers_the_true_p99_at_least_95_percent_of_the_time():
    rng, true_p99 = np.random.default_rng(0), np.log(100)  # exponential samples
    intervals = [quantile_interval(rng.exponential(size=1000), 0.99) for _ in range(400)]
    covered = [low <= true_p99 <= high for low, high in intervals]
    assert np.mean(covered) >= 0.93


def test_a_wider_sample_gives_a_narrower_interval():
    rng = np.random.default_rng(1)
    small, large = (quantile_interval(rng.exponential(size=n), 0.99) for n in (1000, 20000))
    assert large[1] - large[0] < small[1] - small[0]


@pytest.mark.parametrize("n", [100, 300])
def test_too_few_samples_give_no_upper_bound(n):
    low, high = quantile_interval(np.arange(n, dtype=float), 0.99)
    assert high is None and low is not None and low < np.percentile(np.arange(n), 99)


def test_no_samples_give_no_bounds_and_nan_is_not_a_sample():
    assert quantile_interval([], 0.99) == (None, None)
    assert quantile_interval([np.nan] * 5, 0.99) == (None, None)


def test_the_evidence_counts_the_gaps_and_requests_the_p99_rests_on():
    evidence = p99_tbt_evidence(np.r_[np.ones(995), np.full(5, 100.0), np.nan], num_requests=20)
    assert (evidence["tbt_gaps"], evidence["tbt_requests"]) == (1000, 20)
    assert evidence["p99_tbt_low_ms"] == 1.0 and evidence["p99_tbt_high_ms"] == 100.0


def test_prefill_gaps_are_those_ending_in_an_iteration_with_prefill_work():
    batches = [example_batch_record(iteration=i, end_time=float(i), num_prefill_tokens=prefill)
               for i, prefill in enumerate([8, 8, 0, 4, 0])]
    # gaps ending at 2 (decode only), 3 (a prefill chunk rode along) and 4; at 4 again; a failed request's none
    assert prefill_gaps([[1.0, 2.0, 3.0, 4.0], [3.0, 4.0], None], batches) == 1
    assert prefill_gaps([[1.0, 2.0]], None) is None  # a server that is not ours reports no iterations
    assert prefill_gaps([[10.5, 11.5]], batches) is None  # token times of another clock: no iteration's end
