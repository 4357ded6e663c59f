"""How far a percentile of a run's samples can be trusted: a distribution-free confidence interval from order
statistics, and the evidence a P99 TBT verdict rests on.

For n samples and the quantile q, the number of samples below the true quantile is Binomial(n, q); the k-th and
l-th smallest samples bound the quantile with the probability that count falls in [k, l). Where the samples are
too few for an upper order statistic (n = 100 gives none above the 97th-ranked for q = 0.99 at 95%), the bound
is None: the run cannot say the true P99 lies below anything it measured. Token gaps of one request are not
independent (a prefill chunk delays every decode of its iteration), so the interval is narrower than the truth
when gaps cluster; it states the least uncertainty the samples carry.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from scipy import stats

from stallfree.engine.records.batch_record import BatchRecord

CONFIDENCE = 0.95


def quantile_interval(values, q: float, confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """(low, high): order statistics of ``values`` that bound their ``q`` quantile with ``confidence``; a bound
    the samples are too few to give is None (both for no samples)."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[~np.isnan(v)]
    n = len(v)
    if not n:
        return None, None
    tail = (1 - confidence) / 2
    # P(B <= k - 1) <= tail for the low rank k; P(B >= l) <= tail for the high rank l (1-based ranks)
    low_rank = int(stats.binom.ppf(tail, n, q))
    high_rank = int(stats.binom.ppf(1 - tail, n, q)) + 1
    low = float(v[low_rank - 1]) if low_rank >= 1 else None
    high = float(v[high_rank - 1]) if high_rank <= n else None
    return low, high


def prefill_gaps(server_token_times: Iterable[list[float] | None], batches: list[BatchRecord] | None) -> int | None:
    """How many of the requests' token gaps ended in an engine iteration with prefill work: the decodes that
    waited for a prefill chunk, the gaps a TBT SLO is about. A gap ends with its token, whose server time is
    the end of the iteration that sampled it; None without the engine's iterations (a server that is not
    ours), or when no token time is an iteration's end."""
    if not batches:
        return None
    prefill_ends = {b.end_time for b in batches if b.num_prefill_tokens}
    ends = {b.end_time for b in batches}
    matched = [t for times in server_token_times for t in (times or [])[1:] if t in ends]
    return sum(t in prefill_ends for t in matched) if matched else None


def p99_tbt_evidence(gaps_ms, num_requests: int) -> dict:
    """The summary's evidence for its P99 TBT: how many gaps and requests it rests on, and its interval."""
    gaps = np.asarray(gaps_ms, dtype=float)
    low, high = quantile_interval(gaps, 0.99)
    return {"tbt_gaps": int(np.count_nonzero(~np.isnan(gaps))), "tbt_requests": int(num_requests),
            "p99_tbt_low_ms": low, "p99_tbt_high_ms": high}
