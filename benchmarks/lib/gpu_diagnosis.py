"""``python -m benchmarks.gpu --diagnose``: where an offline run's time goes on the GPU.

The offline target compares sarathi-512 with vllm on 128 x 1024 / 128. This measures the same workload at
three chunk sizes beside vllm, and splits one profiled sarathi-512 run by engine phase: each phase is wrapped
in a ``torch.profiler.record_function`` label (a DIAGNOSTIC wrapper),
so the profiler gives its host time and the device time of the kernels it launched. A phase whose host time
is close to the iteration's wall time while the device idles means the run is bound by the host.
"""
from __future__ import annotations

import functools
import time

import torch

from stallfree.engine import LLM, SamplingParams
from stallfree.engine.runner import model_runner


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def labelled(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(f"phase::{name}"):
            return fn(*args, **kwargs)
    return wrapper


def label_phases(llm: LLM) -> None:
    """Wrap the engine's phases of ``llm`` (and the runner module's helpers) in profiler labels."""
    engine, runner = llm.engine, llm.engine.runner
    engine.scheduler.schedule = labelled("schedule", engine.scheduler.schedule)
    engine.scheduler.update_from_output = labelled("update_from_output", engine.scheduler.update_from_output)
    for name in ("prepare_host_batch", "to_device", "sample"):
        setattr(model_runner, name, labelled(name, getattr(model_runner, name)))
    model = runner.model
    runner.model = labelled("forward", model.__call__)
    runner.model.cfg, runner.model.layers = model.cfg, model.layers


def offline_seconds(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    sync()
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    sync()
    return time.perf_counter() - start


def phase_profile(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    label_phases(llm)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        sync()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    # A label appears twice under CUDA: its host range and its range on the device (the GPU user annotation).
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    phases: dict[str, dict] = {}
    for e in events:
        if e.key.startswith("phase::"):
            phase = phases.setdefault(e.key.removeprefix("phase::"), {"calls": 0, "host_ms": 0.0, "device_ms": 0.0})
            if e in on_device:
                phase["device_ms"] += e.device_time_total / 1e3
            else:
                phase["calls"], phase["host_ms"] = e.count, e.cpu_time_total / 1e3
    kernels = sorted((e for e in on_device if not e.key.startswith("phase::")), key=lambda e: -e.self_device_time_total)
    return {"wall_ms": wall * 1e3, "kernel_ms": sum(e.self_device_time_total for e in kernels) / 1e3,
            "phases": phases,
            "top_kernels": [{"name": e.key[:120], "calls": e.count, "device_ms": e.self_device_time_total / 1e3}
                            for e in kernels[:15]],
            "top_host_ops": [{"name": e.key[:120], "calls": e.count, "self_host_ms": e.self_cpu_time_total / 1e3}
                             for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]]}


def diagnose(path: str, prompts: list[list[int]], max_tokens: int, engine_kwargs: dict) -> dict:
    """Offline output tok/s of sarathi at chunk 512 / 1024 / 2048 and of vllm, and a phase profile of sarathi-512."""
    common = dict(max_model_len=4096, max_num_seqs=128, **engine_kwargs)
    runs = {f"sarathi_{chunk}": dict(scheduler="sarathi", chunk_size=chunk) for chunk in (512, 1024, 2048)}
    runs["vllm_4096"] = dict(scheduler="vllm", max_num_batched_tokens=4096)
    tok_s = {}
    for name, knobs in runs.items():
        llm = LLM(path, **knobs, **common)
        tok_s[name] = len(prompts) * max_tokens / offline_seconds(llm, prompts, max_tokens)
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    # Last: the labels stay on the runner module's helpers for the rest of the process.
    llm = LLM(path, **runs["sarathi_512"], **common)
    profile = phase_profile(llm, prompts[:32], 64)
    return {"offline_tok_s": tok_s, "over_vllm": {k: v / tok_s["vllm_4096"] for k, v in tok_s.items()},
            "sarathi_512_profile_32_requests_64_tokens": profile}
