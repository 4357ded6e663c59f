"""What a record was measured on: this machine's CPU, read from /proc/cpuinfo (no torch), as profiles, cost
models, SLO references and benchmarks name it."""
from __future__ import annotations

import functools
import platform


@functools.cache
def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_has_fast_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    flags = _cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def cpu_description() -> str:
    """The CPU's model name and whether it has native bf16: ``AMD EPYC 9R14, native bf16``."""
    name = next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")),
                "")
    return f"{name or platform.processor() or platform.machine()}, {'' if cpu_has_fast_bf16() else 'no '}native bf16"


def same_cpu(hardware: str | None) -> bool | None:
    """Whether a record's ``hardware`` (a cpu_description, perhaps followed by ``, N threads``) names this CPU;
    None when it names none."""
    return None if not hardware else hardware.startswith(cpu_description())
