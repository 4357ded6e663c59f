"""The requests of one process of a Locust run (loadgen/locust/locustfile.py): replayed from ``--specs-file``
or generated from a bench workload, open loop at ``--qps`` (or stepped through ``--step-qps``).
Plain Python, no Locust: it only reads the parsed command-line options."""
from __future__ import annotations

import itertools
import json
import math
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from stallfree.engine.hydra_config import CONF_DIR
from stallfree.loadgen.config.schema import WorkloadGroup, load_group
from stallfree.loadgen.workload.request_specs import RequestSpec, build_workload, is_text_workload

BLOCK = 256  # generated schedules are built this many requests at a time
# the workloads of token ids (text workloads reach Locust through --specs-file)
WORKLOADS = sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml")
                   if not is_text_workload(OmegaConf.load(p).lengths))


def parse_numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of numbers > 0 (an empty text: no numbers)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} must be comma-separated numbers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option} values must be > 0, got {text!r}")
    return values


def request_lengths(opts: Namespace) -> tuple[dict, int | None]:
    """(lengths config, max_total_tokens) of the requests: --workload, or fixed with --prompt-len / --max-tokens."""
    workload = load_group("workload", opts.workload, WorkloadGroup)
    if not (opts.prompt_len or opts.max_tokens):
        return workload.lengths, workload.max_total_tokens
    fixed = load_group("workload", "fixed", WorkloadGroup).lengths
    return {**fixed, "prompt": opts.prompt_len or fixed["prompt"], "output": opts.max_tokens or fixed["output"]}, None


def generated_specs(opts: Namespace, index: int, workers: int) -> Iterator[RequestSpec]:
    """Process ``index`` of ``workers``: Poisson arrivals at qps / workers (with --step-qps: each step's
    rate for --step-seconds, then the schedule ends), send_offset_s from the test start. Built BLOCK
    requests at a time from seeds (seed, index, step, block); the first request of each block (sent at
    the block start) is left out, so every gap is exponential, across blocks and steps too."""
    lengths, max_total_tokens = request_lengths(opts)
    rates = parse_numbers(opts.step_qps, "--step-qps") or [opts.qps]
    step_s = opts.step_seconds if opts.step_qps else math.inf
    ids = itertools.count()
    for step, qps in enumerate(rates):
        start, end = (step * step_s if step else 0.0), (step + 1) * step_s
        for block in itertools.count():
            seed = int(np.random.SeedSequence([opts.seed, index, step, block]).generate_state(1)[0])
            specs = build_workload({"kind": "poisson", "qps": qps / workers}, lengths, BLOCK + 1, seed,
                                   opts.vocab_size, max_total_tokens)[1:]
            for spec in specs:
                spec.send_offset_s += start
                spec.request_id = f"p{index}-{next(ids):06d}"
            kept = [spec for spec in specs if spec.send_offset_s < end]
            yield from kept
            if len(kept) < len(specs):
                break
            start = specs[-1].send_offset_s


def process_specs(opts: Namespace, index: int, workers: int) -> tuple[Iterator[RequestSpec], int | None]:
    """This process's requests and their number (None: unbounded)."""
    if opts.specs_file:
        lines = Path(opts.specs_file).read_text().splitlines()[index::workers]
        return (RequestSpec(**json.loads(line)) for line in lines), len(lines)
    specs = generated_specs(opts, index, workers)
    if not opts.num_requests:
        return specs, None
    count = len(range(index, opts.num_requests, workers))
    return itertools.islice(specs, count), count
