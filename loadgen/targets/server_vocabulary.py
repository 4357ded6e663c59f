"""One vocabulary for what inference servers report on their Prometheus ``/metrics`` page, whatever the
engine: its series names (which differ by engine and version) mapped onto ours, in one table.

Ours (``METRICS``): ``requests_running``, ``requests_waiting``, ``kv_cache_usage`` (fraction of the KV
cache in use, 0-1), and the counters ``preemptions_total``, ``prefix_cache_queries_total`` /
``prefix_cache_hits_total`` (prompt tokens looked up in / found in the prefix cache). stallfree's own
server also gives the ``_sum`` / ``_count`` of its per-iteration MFU and MBU histograms, and its prefix cache's
size ``prefix_cache_blocks`` (free blocks holding a cached prefix) and ``prefix_cache_evictions_total``.

A page's engine is the first of ``ENGINES`` one of whose series carries its prefix (stallfree's server
uses vLLM's names and adds ``stallfree:`` series, so it comes first). Each of our metrics is the first of
its engine's names that the page has (versions renamed some series); a counter's name matches with or
without ``_total``. Values are combined over label sets (``model_name``, ``engine``, ...): counts summed,
fractions averaged.
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Series:
    metric: str  # our name
    names: tuple[str, ...]  # the engine's names for it, in order of preference
    combine: str = "sum"  # over label sets: sum (counts) or mean (fractions)


@dataclass(frozen=True)
class Sample:
    metric: str
    value: float
    series: str  # the raw sample name it was read from


@dataclass(frozen=True)
class Page:
    """What one scrape of /metrics said in our vocabulary; ``engine`` None: no series we know."""

    engine: str | None
    samples: list[Sample]


QUEUE = ("requests_running", "requests_waiting")
METRICS = (*QUEUE, "kv_cache_usage", "preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
           "prefix_cache_blocks", "prefix_cache_evictions_total")
VLLM = (
    Series("requests_running", ("vllm:num_requests_running",)),
    Series("requests_waiting", ("vllm:num_requests_waiting",)),
    Series("kv_cache_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), combine="mean"),
    Series("preemptions_total", ("vllm:num_preemptions",)),
    Series("prefix_cache_queries_total", ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")),
    Series("prefix_cache_hits_total", ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")),
)
STALLFREE = (
    *VLLM,
    Series("prefix_cache_blocks", ("stallfree:prefix_cache_blocks",)),
    Series("prefix_cache_evictions_total", ("stallfree:prefix_cache_evictions",)),
    *(Series(f"iteration_{u}_{part}", (f"stallfree:iteration_{u}_{part}",))
      for u in ("mfu", "mbu") for part in ("sum", "count")),
)
SGLANG = (
    Series("requests_running", ("sglang:num_running_reqs",)),
    Series("requests_waiting", ("sglang:num_queue_reqs",)),
    Series("kv_cache_usage", ("sglang:token_usage",), combine="mean"),
    Series("preemptions_total", ("sglang:num_retracted_requests",)),  # SGLang retracts (preempts) requests
    Series("prefix_cache_queries_total", ("sglang:prompt_tokens",)),  # every prompt token, cached ones included
    Series("prefix_cache_hits_total", ("sglang:cached_tokens",)),
)
# engine -> (the family-name prefix that identifies it, its series); the first match wins
ENGINES: dict[str, tuple[str, tuple[Series, ...]]] = {
    "stallfree": ("stallfree:", STALLFREE),
    "vllm": ("vllm:", VLLM),
    "sglang": ("sglang:", SGLANG),
}


def _combined(values: list[float], combine: str) -> float:
    return sum(values) / len(values) if combine == "mean" else sum(values)


def read_page(text: str) -> Page:
    """A /metrics page (Prometheus text format) in our vocabulary. Raises ValueError when it does not parse."""
    lines = text.splitlines()
    engine = next((name for name, (prefix, _) in ENGINES.items() if any(line.startswith(prefix) for line in lines)),
                  None)
    if engine is None:
        list(text_string_to_metric_families(text))  # a page that is not Prometheus text raises ValueError
        return Page(None, [])
    series = ENGINES[engine][1]
    # Only the sample lines of the series we map are parsed, in the load generator's process: the pure-Python
    # parser took about 36 ms for the 393 lines of stallfree-serve's page (mostly histogram buckets), 2 ms for
    # the lines kept (shared 2-core machine).
    names = tuple(name for s in series for name in s.names)
    values: dict[str, list[float]] = {}  # raw sample name -> its values, one per label set
    for family in text_string_to_metric_families("\n".join(line for line in lines if line.startswith(names))):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)
    samples = []
    for s in series:
        found = next((raw for name in s.names for raw in (name, f"{name}_total") if raw in values), None)
        if found is not None:
            samples.append(Sample(s.metric, _combined(values[found], s.combine), found))
    return Page(engine, samples)
