"""The requests of one process of a Locust run (loadgen/locust/locustfile.py), grouped by session: replayed
from ``--specs-file`` or generated from a bench workload, open loop at ``--qps`` (or stepped through
``--step-qps``).
Plain Python, no Locust: it only reads the parsed command-line options."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from argparse import Namespace
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from stallfree.engine.hydra_config import CONF_DIR
from stallfree.engine.records.request_spec import REQUEST_LIMIT, session_groups
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


def _groups(specs: list[RequestSpec]) -> list[list[RequestSpec]]:
    """The specs as groups: a session's turns together, every other request alone."""
    return [[specs[i] for i in group] for group in session_groups(specs)]


def generated_groups(opts: Namespace, index: int, workers: int) -> Iterator[list[RequestSpec]]:
    """Process ``index`` of ``workers``: Poisson arrivals of requests (or sessions) at qps / workers (with
    --step-qps: each step's rate for --step-seconds, then the schedule ends), send_offset_s from the test
    start. Built BLOCK requests at a time from seeds (seed, index, step, block); the first request or session
    of each block (sent at the block start) is left out, so every gap is exponential, across blocks and steps
    too, and so is a last session the block's request count cut short."""
    lengths, max_total_tokens = request_lengths(opts)
    rates = parse_numbers(opts.step_qps, "--step-qps") or [opts.qps]
    step_s = opts.step_seconds if opts.step_qps else math.inf
    ids, sessions = itertools.count(), itertools.count()
    for step, qps in enumerate(rates):
        start, end = (step * step_s if step else 0.0), (step + 1) * step_s
        for block in itertools.count():
            seed = int(np.random.SeedSequence([opts.seed, index, step, block]).generate_state(1)[0])
            groups = _groups(build_workload({"kind": "poisson", "qps": qps / workers}, lengths, BLOCK + 1, seed,
                                            opts.vocab_size, max_total_tokens))
            groups = groups[1:-1] if groups[-1][-1].session_end == REQUEST_LIMIT else groups[1:]
            for group in groups:
                session_id = f"p{index}-s{next(sessions):05d}" if group[0].session_id is not None else None
                for spec in group:
                    spec.send_offset_s += start
                    spec.request_id, spec.session_id = f"p{index}-{next(ids):06d}", session_id
            kept = [group for group in groups if group[0].send_offset_s < end]
            yield from kept
            if len(kept) < len(groups):
                break
            start = groups[-1][0].send_offset_s


def first_requests(groups: Iterable[list[RequestSpec]], count: int) -> Iterator[list[RequestSpec]]:
    """The groups of the first ``count`` requests; a session the count cuts short ends there (REQUEST_LIMIT)."""
    for group in groups:
        if count <= len(group):
            if count < len(group):
                group = [*group[:count - 1], dataclasses.replace(group[count - 1], session_end=REQUEST_LIMIT)]
            yield group
            return
        count -= len(group)
        yield group


def process_groups(opts: Namespace, index: int, workers: int) -> tuple[Iterator[list[RequestSpec]], int | None]:
    """This process's requests, grouped by session, and their number (None: unbounded); from --specs-file,
    worker i of W takes every W-th group."""
    if opts.specs_file:
        lines = Path(opts.specs_file).read_text().splitlines()
        groups = _groups([RequestSpec(**json.loads(line)) for line in lines])[index::workers]
        return iter(groups), sum(len(group) for group in groups)
    groups = generated_groups(opts, index, workers)
    if not opts.num_requests:
        return groups, None
    count = len(range(index, opts.num_requests, workers))
    return first_requests(groups, count), count
