"""Profile an engine's real runner and fit a ``CostModel`` on its BatchRecords.

The profile covers the iteration shapes the studies produce: prefill-only and decode-only iterations
(``vllm``), and hybrid ones with small and large chunks (``sarathi`` at 128 and 512 tokens), over prompts
of varied lengths up to ``max_model_len`` and a range of decode batch sizes.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import torch

from stallfree.engine.cache_dir import cache_root
from stallfree.engine.config import EngineConfig
from stallfree.engine.hydra_config import cost_model_file
from stallfree.engine.records import BatchRecord
from stallfree.engine.records.machine import cpu_description
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.clock import CLOCKS
from stallfree.engine.runner.cpu_threads import quiet_threads
from stallfree.engine.simulator.fitting.cost_model import COST_MODEL_VERSION, ENGINE_REVISION, CostModel

PROFILE_POLICIES = (("vllm", None), ("sarathi", 128), ("sarathi", 512))
WARMUP_ITERATIONS = 2  # the first iterations of an engine carry one-off costs (allocation, kernel builds)
# Half of a policy's requests come at once (large decode batches, whole-budget chunks), half one every
# STAGGER_STEPS iterations, as open-loop arrivals come: lone prompts' prefills beside a few decodes.
STAGGER_STEPS = 8


class ProfiledEngine(Protocol):
    """What profiling needs of an engine (LLMEngine; passed in, since the engine is built on runners)."""

    max_model_len: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    batch_records: list[BatchRecord]

    def add_request(self, prompt: list[int], params: SamplingParams) -> str: ...

    def step(self) -> list: ...

    def has_unfinished(self) -> bool: ...


def resolve_cost_model(config: EngineConfig, make_engine: Callable[[EngineConfig], ProfiledEngine]) -> CostModel | None:
    """The cost model a simulated runner of ``config`` times iterations by: ``model.cost_model``, or one
    profiled on this model's real runner (cached, see ``profile_cost_model``); None for other runners. A step
    of its own, taken before the engine is built, since profiling builds real engines."""
    mc = config.model
    if mc.runner != "simulated" or mc.deployment is not None or config.parallel.pipeline_parallel_size > 1:
        return None  # a simulated pipeline's stage cost models are read by engine/executor.py
    CLOCKS[mc.clock]  # a bad model.clock fails before the profile runs, not after
    if mc.cost_model:
        return CostModel.load(cost_model_file(mc.cost_model, "model.cost_model"))
    return profile_cost_model(config, make_engine)


def profile_cost_model(config: EngineConfig, make_engine: Callable[[EngineConfig], ProfiledEngine], *,
                       num_requests: int = 12, seed: int = 0, use_cache: bool = True,
                       progress: Callable[[int], None] | None = None) -> CostModel:
    """Fit a cost model on the real runner of ``config``'s model, on engines from ``make_engine``. With
    ``use_cache`` it is kept as JSON in the preset cache folder, keyed by everything that changes
    iteration times. ``progress`` gets the number of requests finished since its last call."""
    mc, cc = config.model, config.cache
    key = [COST_MODEL_VERSION, ENGINE_REVISION, mc.model, mc.max_model_len, mc.dtype, mc.device, mc.attention_backend,
           cc.block_size, quiet_threads(), num_requests, seed]  # max_model_len: the profile's longest prompts
    path = cache_root() / "cost_models" / (hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16] + ".json")
    if use_cache and path.is_file():
        return CostModel.load(path)
    rng = random.Random(seed)
    records: list[BatchRecord] = []
    for policy, chunk_size in PROFILE_POLICIES:
        scheduler = replace(config.scheduler, policy=policy, chunk_size=chunk_size or config.scheduler.chunk_size)
        engine = make_engine(replace(config, model=replace(mc, runner="model"), scheduler=scheduler))
        requests = random_requests(rng, num_requests, engine, max_prompt=1024, max_output=64)
        requests += context_filling_prompts(rng, engine)
        half = num_requests // 2
        for stagger_steps, part in ((0, requests[:half]), (STAGGER_STEPS, requests[half:])):
            feed_requests(engine, part, stagger_steps, progress)
        records += engine.batch_records[WARMUP_ITERATIONS:]
    model = CostModel.fit(records, seed=seed, fitted_on=_describe(config, engine))
    if use_cache:
        model.save(path)
    return model


def random_requests(rng: random.Random, count: int, engine: ProfiledEngine, *, max_prompt: int,
                    max_output: int) -> list[tuple[list[int], SamplingParams]]:
    """``count`` requests of random tokens, 16 to ``max_prompt`` (at most half the context) long, with 8 to
    ``max_output`` output tokens."""
    limit = min(max_prompt, engine.max_model_len // 2)
    # Greedy, as the load generator's requests are: random sampling costs ~0.6 ms a sequence on
    # a CPU (softmax and noise over the vocabulary), which inflated the fitted decode cost 2x.
    return [([rng.randrange(3, engine.vocab_size) for _ in range(rng.randint(16, limit))],
             SamplingParams(max_tokens=rng.randint(8, max_output), temperature=0.0, ignore_eos=True))
            for _ in range(count)]


def context_filling_prompts(rng: random.Random, engine: ProfiledEngine,
                            max_output: int = 8) -> list[tuple[list[int], SamplingParams]]:
    """A prompt as long as the context holds beside ``max_output`` tokens, and one of 3/4 of that: the longest
    prefills a policy runs (``vllm``'s whole prompts). A fit on prompts up to 1,024 tokens put a lone prompt of
    `small` at 4,000 tokens 1.17-1.18x too slow on a 2-core EPYC (docs/performance.md)."""
    longest = engine.max_model_len - max_output
    return [([rng.randrange(3, engine.vocab_size) for _ in range(length)],
             SamplingParams(max_tokens=max_output, temperature=0.0, ignore_eos=True))
            for length in (longest, longest * 3 // 4)]


def feed_requests(engine: ProfiledEngine, requests: list[tuple[list[int], SamplingParams]], stagger_steps: int,
                  progress: Callable[[int], None] | None = None) -> None:
    """Run ``requests`` to the end: all at once (``stagger_steps`` 0), or one every ``stagger_steps`` steps."""
    pending = list(reversed(requests)) if stagger_steps else []
    if not stagger_steps:
        for request in requests:
            engine.add_request(*request)
    steps = 0
    while pending or engine.has_unfinished():
        if pending and steps % stagger_steps == 0:
            engine.add_request(*pending.pop())
        finished = sum(out.finished for out in engine.step())
        steps += 1
        if progress is not None and finished:
            progress(finished)


def _describe(config: EngineConfig, engine: ProfiledEngine) -> dict:
    device = engine.device
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"{cpu_description()}, {quiet_threads()} threads")
    return {"model": config.model.model, "device": str(device), "hardware": hardware, "dtype": str(engine.dtype),
            "attention_backend": config.model.attention_backend, "block_size": config.cache.block_size,
            "torch": torch.__version__, "engine_revision": ENGINE_REVISION, "date": datetime.date.today().isoformat(),
            "policies": [f"{p}-{c}" if c else p for p, c in PROFILE_POLICIES]}
