"""Machine limits: the peak matmul FLOP/s and the memory bandwidth of a device in a dtype, measured once per
machine and cached (``<cache>/machine_limits.json``, keyed by the device, its threads, the dtype and METHOD).

Both are the best of several trials: a limit is a maximum, and a shared machine's noise only ever lowers a
trial. The matmul peak is the best of PyTorch's default matmul and, where the engine uses them, oneDNN with a
packed weight (engine/model/packed_linear.py) and the tiled linear (engine/model/tiled_linear.py): a peak below
a kernel the engine runs would put MFU above 1. The bandwidth is the highest read rate from memory: a stream
over a buffer four times the last-level cache (1 GiB at least), read by a reduction and by a one-row product
with a weight of that size (what a batch-1 decode step does), through PyTorch's kernel and, where the engine
uses it, the tiled linear (engine/model/tiled_linear.py). Reads only: a copy's stores first fetch the lines they
overwrite (write-allocate), so counting a copy as read + write puts the limit a third below what moved, and
the engine's own kernels then ran above it. ``benchmarks/engine_throughput.py`` and ``benchmarks/gpu.py``
measure with these functions and refresh the cache.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from stallfree.engine.cache_dir import cache_root
from stallfree.engine.model.packed_linear import PackedLinear, can_pack
from stallfree.engine.model.tiled_linear import TiledLinear, can_use_tiled_linear
from stallfree.engine.records.machine import cpu_description

CPU = torch.device("cpu")
METHOD = "read stream, held cores"  # part of the cache key: limits measured another way are measured again
STREAM_MIN_BYTES = 1 << 30
STREAM_DEPTH = 4096  # the streamed weight's input features
MATMUL_CALL_S = 0.05  # a CPU matmul trial's call takes about this long (cpu_matmul_size)
BUSY = " on a busy machine: low"


class LowLimitWarning(UserWarning):
    """No trial of a limit held its cores: the figure is low."""


@dataclass(frozen=True)
class MachineLimits:
    device: str  # what was measured: the CPU model and threads, or the GPU's name
    dtype: str
    peak_flops: float  # matmul FLOP/s
    bandwidth: float  # memory bytes/s
    source: str  # "measured YYYY-MM-DD" (+ BUSY where no trial held its cores), or "published" (a simulated GPU)

    @property
    def busy(self) -> bool:
        """Measured on a busy machine: low."""
        return self.source.endswith(BUSY)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def held_cores(cpu_s: float, wall_s: float, threads: int) -> bool:
    """Whether the process ran on all its threads' cores for the span (CPU time >= 90% of threads x wall)."""
    return cpu_s >= 0.9 * threads * wall_s


def kernel_threads(trials: list[tuple[float, float]]) -> int:
    """The threads a kernel runs on, from its trials' (CPU seconds, wall seconds): the most CPU per wall second
    any trial got, rounded up, at most torch's thread count (a bf16 matmul without native bf16 runs on one)."""
    ratio = max(cpu / wall for cpu, wall in trials)
    return max(1, min(torch.get_num_threads(), math.ceil(ratio - 0.05)))


def best_rate(work: float, fn: Callable[[], object], trials: int = 5, repeats: int = 5,
              clock: Callable[[], float] = time.perf_counter, device: torch.device = CPU) -> float:
    """``work`` units per second of ``fn``, the best of ``trials`` trials of ``repeats`` calls (after one
    warm-up call). On a CPU a trial counts only where the process held the cores the kernel runs on
    (``held_cores``, ``kernel_threads``): one that another process interrupted times that process too. Up to
    2 x ``trials`` run for that; where none held, the best of them, with a warning that the limit is low."""
    fn()
    timed: list[tuple[float, float, float]] = []  # (rate, CPU seconds, wall seconds)
    held: list[float] = []
    for _ in range(2 * trials):
        _sync(device)
        start, cpu_start = clock(), time.process_time()
        for _ in range(repeats):
            fn()
        _sync(device)
        wall, cpu = clock() - start, time.process_time() - cpu_start
        timed.append((work * repeats / wall, cpu, wall))
        if device.type == "cpu":
            threads = kernel_threads([(c, w) for _, c, w in timed])
            held = [rate for rate, c, w in timed if held_cores(c, w, threads)]
        else:
            held = [rate for rate, _, _ in timed]
        if len(held) >= trials:
            break
    if not held:
        warnings.warn("every trial shared its cores with another process: the limit measured is low "
                      "(python -m stallfree.engine.utilization.measured_limits --refresh on a quiet machine)",
                      LowLimitWarning, stacklevel=2)
    return max(held) if held else max(rate for rate, _, _ in timed)


def cpu_matmul_size(dtype: torch.dtype, call_s: float = MATMUL_CALL_S) -> int:
    """The square matmul size whose call takes about ``call_s`` on this CPU in ``dtype`` (a multiple of 256, at
    most 2048): a CPU without native bf16 runs a bf16 matmul a hundred times slower than one with AMX, and a
    size fit for the fast one would take minutes there."""
    a = torch.randn(256, 256).to(dtype)
    a @ a
    start = time.perf_counter()
    a @ a
    rate = 2 * 256**3 / max(time.perf_counter() - start, 1e-9)
    return int(min(2048, max(256, (call_s * rate / 2) ** (1 / 3) // 256 * 256)))


def measure_matmul_flops(dtype: torch.dtype, device: torch.device = CPU, n: int | None = None,
                         clock: Callable[[], float] = time.perf_counter) -> float:
    n = n or (8192 if device.type == "cuda" else cpu_matmul_size(dtype))
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    best = best_rate(2 * n**3, lambda: a @ b, clock=clock, device=device)
    if can_pack(device, dtype):
        linear = torch.nn.Linear(n, n, bias=False, dtype=dtype)
        packed = PackedLinear(linear)
        best = max(best, best_rate(2 * n**3, lambda: packed(a), clock=clock))
        if can_use_tiled_linear(device, dtype, linear):
            tiled = TiledLinear(linear)
            with torch.inference_mode():
                best = max(best, best_rate(2 * n**3, lambda: tiled(a), clock=clock))
    return best


def last_level_cache_bytes() -> int:
    """The largest CPU cache (sysfs), 0 where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=0)


def stream_bytes(device: torch.device) -> int:
    """A buffer that no cache holds: 4x the CPU's last-level cache, 1 GiB at least."""
    return max(STREAM_MIN_BYTES, 4 * last_level_cache_bytes()) if device.type == "cpu" else STREAM_MIN_BYTES


def measure_bandwidth(device: torch.device = CPU, dtype: torch.dtype = torch.float32,
                      num_bytes: int | None = None) -> float:
    """Bytes read per second from memory: the best of the read streams (module docstring)."""
    num_bytes = num_bytes or stream_bytes(device)
    buffer = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    best = best_rate(num_bytes, buffer.sum, repeats=2, device=device)
    del buffer
    linear = torch.nn.Linear(STREAM_DEPTH, num_bytes // dtype.itemsize // STREAM_DEPTH, bias=False,
                             device=device, dtype=dtype)
    row = torch.randn(1, STREAM_DEPTH, device=device, dtype=dtype)
    weight_bytes = linear.weight.numel() * dtype.itemsize
    with torch.inference_mode():
        best = max(best, best_rate(weight_bytes, lambda: linear(row), repeats=2, device=device))
        if can_use_tiled_linear(device, dtype, linear):
            tiled = TiledLinear(linear)
            best = max(best, best_rate(weight_bytes, lambda: tiled(row), repeats=2))
    return best


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_description()}, {torch.get_num_threads()} threads"


def measure(device: torch.device, dtype: torch.dtype) -> MachineLimits:
    """The limits; ``source`` says when some of them were measured on a busy machine (so are low)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flops, bandwidth = measure_matmul_flops(dtype, device), measure_bandwidth(device, dtype)
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    busy = any(issubclass(warning.category, LowLimitWarning) for warning in caught)
    return MachineLimits(device_description(device), str(dtype).removeprefix("torch."), flops, bandwidth,
                         f"measured {datetime.date.today().isoformat()}" + (BUSY if busy else ""))


def cache_path() -> Path:
    return cache_root() / "machine_limits.json"


def machine_limits(device: torch.device, dtype: torch.dtype, *, refresh: bool = False) -> MachineLimits:
    """This machine's limits for ``device`` and ``dtype``: from the cache, or measured (a few seconds) and
    cached. ``refresh``: measure again and replace the cached figures."""
    key = f"{device_description(device)} | {str(dtype).removeprefix('torch.')} | {METHOD}"
    path = cache_path()
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if key in cached and not refresh:
        return MachineLimits(**cached[key])
    limits = measure(device, dtype)
    cached = json.loads(path.read_text()) if path.is_file() else {}  # another process may have written meanwhile
    cached[key] = asdict(limits)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(cached, indent=2) + "\n")
    tmp.replace(path)
    return limits


def main() -> None:
    """``python -m stallfree.engine.utilization.measured_limits [--refresh] [--dtype bfloat16] [--device cpu]``: print the limits."""
    import argparse

    from stallfree.engine.device import choose_dtype, resolve_device

    ap = argparse.ArgumentParser(description="This machine's matmul peak and memory bandwidth (cached).")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--refresh", action="store_true", help="measure again (on a quiet machine)")
    args = ap.parse_args()
    device = resolve_device(args.device)
    limits = machine_limits(device, choose_dtype(args.dtype, device).dtype, refresh=args.refresh)
    print(f"{limits.device} {limits.dtype}: {limits.peak_flops / 1e12:.3f} TFLOP/s, {limits.bandwidth / 1e9:.1f} GB/s "
          f"({limits.source}; cached in {cache_path()})")


if __name__ == "__main__":
    main()
