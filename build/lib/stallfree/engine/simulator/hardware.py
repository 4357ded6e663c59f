"""Published specifications of the GPUs the simulator models (dense bf16 tensor-core peak, no sparsity).

Sources, the vendors' datasheets:
* A100 80GB SXM: NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS, HBM2e 2,039 GB/s, 80 GB.
* A40: NVIDIA A40 datasheet (2020): BF16 149.7 TFLOPS, GDDR6 696 GB/s, 48 GB.
* H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 989 TFLOPS (1,979 with sparsity),
  HBM3 3.35 TB/s, 80 GB.
* H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (2024): BF16 989 TFLOPS (1,979 with sparsity),
  HBM3e 4.8 TB/s, 141 GB.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    name: str                 # "a100", "a40", "h100", "h200"
    peak_tflops_bf16: float   # published dense bf16 tensor-core peak
    mem_bandwidth_gbps: float # published HBM/GDDR bandwidth, GB/s
    memory_gib: float         # device memory (the A100/H100 "80 GB" parts hold 80 GiB; H200 reports ~140 GiB)


GPUS: dict[str, GPUSpec] = {g.name: g for g in (
    GPUSpec("a100", 312.0, 2039.0, 80.0),
    GPUSpec("a40", 149.7, 696.0, 48.0),
    GPUSpec("h100", 989.0, 3350.0, 80.0),
    GPUSpec("h200", 989.0, 4800.0, 140.0),
)}
