"""The unloaded TTFT of a target, measured once per capacity search: the baseline of the client-side
scheduling delay (engine.records.request_metrics.pace_summary).

The shortest and the longest prompt of the search's workload are each sent ``REQUESTS_PER_LENGTH`` times,
one request at a time (nothing else in flight); the median TTFT (first token - send) of each length gives
a line in the prompt length, ``UnloadedTtft``, that interpolates between them.
"""
from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from stallfree.engine.records.request_metrics import UnloadedTtft
from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import digest, workload_tokenizer
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.targets.base import Target
from stallfree.loadgen.workload.request_specs import build_workload

REQUESTS_PER_LENGTH = 3
OUTPUT_TOKENS = 2  # the first token is what counts; a second keeps servers that special-case one token honest
_measured_here: set[Path] = set()  # caches this process wrote (rerun=all measures each one once)


def _ttft_ms(target: Target, spec) -> float:
    [record] = target.replay([spec], warmup=0, progress=None).records
    if record.status != "ok" or record.first_token_time is None:
        raise TargetError(f"an unloaded TTFT request failed ({record.error or 'no token'}); check the target")
    return (record.first_token_time - record.send_time) * 1e3


def measure_unloaded_ttft(cfg: BenchConfig, target: Target) -> tuple[UnloadedTtft, dict]:
    """The line, and a record of how it was measured (method, prompt lengths, every TTFT, when)."""
    largest = cfg.capacity.num_requests(cfg.capacity.max_qps, cfg.num_requests)  # every prompt of the search
    specs = build_workload(cfg.arrival.settings(), cfg.workload.lengths, largest, cfg.seed,
                           target.vocab_size, cfg.workload.max_total_tokens, tokenizer=workload_tokenizer(cfg))
    by_length = sorted(specs, key=lambda s: len(s.prompt_token_ids))
    shortest, longest = (dataclasses.replace(s, send_offset_s=0.0, max_tokens=OUTPUT_TOKENS)
                         for s in (by_length[0], by_length[-1]))
    measured_at = datetime.now(UTC).isoformat(timespec="seconds")
    ttfts = {len(s.prompt_token_ids): [_ttft_ms(target, s) for _ in range(REQUESTS_PER_LENGTH)]
             for s in (shortest, longest)}
    medians = sorted((n, float(np.median(v))) for n, v in ttfts.items())
    (short, short_ms), (long, long_ms) = medians[0], medians[-1]
    slope = (long_ms - short_ms) / (long - short) if long > short else 0.0
    line = UnloadedTtft(short_ms - slope * short, slope)
    record = {"method": f"{REQUESTS_PER_LENGTH} sequential single requests at each of the prompt lengths, "
                        "median TTFT per length, linear in the prompt length",
              "intercept_ms": line.intercept_ms, "per_prompt_token_ms": line.per_prompt_token_ms,
              "measurements_ms": {str(n): [round(t, 3) for t in v] for n, v in ttfts.items()},
              "measured_at": measured_at}
    return line, record


def cached_unloaded_ttft(cfg: BenchConfig, exp_dir: Path, targets: LiveTarget) -> tuple[UnloadedTtft, dict]:
    """``measure_unloaded_ttft`` once per model / target / workload / seed, cached in ``exp_dir/.probes/`` like
    the SLO reference (loadgen.sweep.slo), so a resumed search judges its cached points by the same line;
    ``rerun=all`` measures it again once per process."""
    key = {"model": dataclasses.asdict(cfg.model), "cache": dataclasses.asdict(cfg.cache), "target": cfg.target.kind,
           "url": cfg.target.url, "workload": dataclasses.asdict(cfg.workload), "seed": cfg.seed, "num_requests": cfg.num_requests}
    path = exp_dir / ".probes" / f"unloaded-ttft-{digest(key)}.json"
    if path.is_file() and (cfg.rerun != "all" or path in _measured_here):
        record = json.loads(path.read_text())["unloaded_ttft"]
    else:
        _, record = measure_unloaded_ttft(cfg, targets.get(cfg, exp_dir / ".logs"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"unloaded_ttft": record, **key}, indent=2) + "\n")
        tmp.replace(path)
        _measured_here.add(path)
    return UnloadedTtft(record["intercept_ms"], record["per_prompt_token_ms"]), record
