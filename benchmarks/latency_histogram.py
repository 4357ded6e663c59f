"""The LLM tab's percentile histogram (loadgen.locust.llm_stats.LogHistogram: 2 %-wide log bins in numpy)
against the maintained libraries that do the same job: DDSketch (``ddsketch``, relative accuracy 1 %) and
HdrHistogram (``hdrhistogram``, microseconds, 2 significant digits), on what the tab feeds them: batches
of token gaps as a process drains them (about one batch a second), then percentile queries.

    python -m benchmarks.latency_histogram [--values 200000] [--batch 500] [--out benchmarks/results/latency_histogram.json]

Per histogram: the worst relative error of p50 / p90 / p99 / p99.9 against the exact nearest-rank values
(over three distributions: lognormal decode gaps, a bimodal mix of decode gaps and prefill stalls, and a
heavy Pareto tail), the time to add every batch, and the time of one query of the four percentiles.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from ddsketch import DDSketch
from hdrh.histogram import HdrHistogram

from stallfree.loadgen.locust.llm_stats import LogHistogram

QUANTILES = (50.0, 90.0, 99.0, 99.9)


def distributions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    decode = rng.lognormal(math.log(20.0), 0.3, n)
    stalls = rng.lognormal(math.log(400.0), 0.5, n)
    return {"lognormal_decode_ms": decode,
            "bimodal_decode_and_stalls_ms": np.where(rng.random(n) < 0.95, decode, stalls),
            "pareto_tail_ms": 5.0 * (1.0 + rng.pareto(1.5, n))}


class Ours:
    name = "LogHistogram (ours)"

    def __init__(self):
        self.h = LogHistogram()

    def add(self, batch):
        self.h.add(batch)

    def quantiles(self):
        return [self.h.percentile(q) for q in QUANTILES]


class DD:
    name = "DDSketch (relative accuracy 1%)"

    def __init__(self):
        self.h = DDSketch(relative_accuracy=0.01)

    def add(self, batch):
        for value in batch.tolist():
            self.h.add(value)

    def quantiles(self):
        return [self.h.get_quantile_value(q / 100) for q in QUANTILES]


class Hdr:
    name = "HdrHistogram (us, 2 significant digits)"

    def __init__(self):
        self.h = HdrHistogram(1, 20 * 60 * 10**6, 2)

    def add(self, batch):
        for value in np.maximum(1, np.rint(batch * 1e3)).astype(np.int64).tolist():
            self.h.record_value(value)

    def quantiles(self):
        return [self.h.get_value_at_percentile(q) / 1e3 for q in QUANTILES]


def exact(values: np.ndarray) -> list[float]:
    return [float(np.percentile(values, q, method="inverted_cdf")) for q in QUANTILES]


def measure(kind, values: np.ndarray, batch: int) -> dict:
    histogram = kind()
    batches = np.array_split(values, max(1, len(values) // batch))
    start = time.perf_counter()
    for b in batches:
        histogram.add(b)
    add_s = time.perf_counter() - start
    start = time.perf_counter()
    got = histogram.quantiles()
    query_s = time.perf_counter() - start
    errors = [abs(g - e) / e for g, e in zip(got, exact(values), strict=True)]
    return {"max_rel_error": max(errors), "add_ns_per_value": add_s / len(values) * 1e9, "query_ms": query_s * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--out", default="benchmarks/results/latency_histogram.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results: dict = {}
    for dist, values in distributions(rng, args.values).items():
        results[dist] = {kind.name: measure(kind, values, args.batch) for kind in (Ours, DD, Hdr)}
    summary = {name: {"worst_rel_error": max(results[d][name]["max_rel_error"] for d in results),
                      "add_ns_per_value": float(np.median([results[d][name]["add_ns_per_value"] for d in results])),
                      "query_ms": float(np.median([results[d][name]["query_ms"] for d in results]))}
               for name in (Ours.name, DD.name, Hdr.name)}
    out = {"values": args.values, "batch": args.batch, "quantiles": QUANTILES,
           "machine": "shared 2-core machine (other work running): times are indicative, ratios matter",
           "summary": summary, "per_distribution": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
