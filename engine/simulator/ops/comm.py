"""Communication: the TP all-reduce of a layer's activations and the PP send/recv between stages, from
Vidur's NCCL profiles (time by message size in bytes).

An ``interconnect`` names which profiles a deployment uses:

* ``nvlink``: a node of 4 GPUs joined pairwise by NVLink (a100, h100, h200; ``<gpu>_pairwise_nvlink``);
  TP 8 does not fit such a node and uses the 8-GPU NVSwitch profile (``<gpu>_dgx``).
* ``dgx``: an 8-GPU NVSwitch node (DGX A100 / DGX H100; ``<gpu>_dgx``).
* ``pcie``: the A40 node (all-reduce from Vidur's older ``data/profiling/a40/all_reduce.csv``, send/recv from
  ``a40_pairwise_nvlink``; Vidur publishes no other A40 network profile, so ``nvlink`` on an A40 is the same).
* any of these with ``-internode``: the deployment spans nodes of ``NODE_GPUS`` GPUs. The PP send/recv goes
  between nodes (Vidur's rows with one device per node); the TP all-reduce stays inside a node up to
  ``NODE_GPUS`` GPUs, and a TP group larger than a node all-reduces across nodes (Vidur's DGX A100 rows of
  8 workers with 4 per node: the paper's Falcon-180B TP8 on two 4-GPU nodes).

H200s use the H100 profiles (the same NVLink 4 / NVSwitch fabric). The all-reduce and the send move
tokens x hidden x 2 bytes (bf16 activations); a size between two profiled ones is interpolated
linearly, one past the largest extrapolated along the last profiled bandwidth.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from stallfree.engine.simulator.ops import profile_data

INTERCONNECTS = {"a100": ("nvlink", "dgx"), "h100": ("nvlink", "dgx"), "h200": ("nvlink", "dgx"),
                 "a40": ("pcie", "nvlink")}
INTERNODE = "-internode"
NODE_GPUS = 4  # GPUs per node of an -internode deployment (the paper's A100 and A40 nodes)
DTYPE_BYTES = 2


@dataclass(frozen=True)
class SizeCurve:
    sizes: tuple[int, ...]   # bytes, ascending
    seconds: tuple[float, ...]
    source: str

    @classmethod
    def load(cls, file: str, num_workers: int, devices_per_node: int) -> SizeCurve:
        op = file.rsplit("/", 1)[1].removesuffix(".csv.gz")
        points: dict[int, list[float]] = {}
        for row in profile_data.rows(file):
            if int(row["num_workers"]) == num_workers and int(row["devices_per_node"]) == devices_per_node:
                points.setdefault(int(row["size"]), []).append(profile_data.ms(row[f"time_stats.{op}.median"]))
        if len(points) < 2:
            raise ValueError(f"interconnect: {file} has no {op} profile of {num_workers} GPUs with "
                             f"{devices_per_node} per node")
        sizes = sorted(points)
        return cls(tuple(sizes), tuple(sum(points[s]) / len(points[s]) for s in sizes), file)

    def at(self, size: int) -> float:
        if size > self.sizes[-1]:  # the largest message's bandwidth (the last two rows' slope is noise)
            return self.seconds[-1] * size / self.sizes[-1]
        i = min(max(bisect.bisect_left(self.sizes, size), 1), len(self.sizes) - 1)
        (s0, s1), (t0, t1) = self.sizes[i - 1:i + 1], self.seconds[i - 1:i + 1]
        return max(self.seconds[0], t0 + (t1 - t0) * (size - s0) / (s1 - s0))


def profile_files(gpu: str, interconnect: str, tp: int) -> tuple[str | None, int, str, int]:
    """(all-reduce file or None at TP 1, devices per node of its rows, send/recv file, devices per node of
    the send/recv rows)."""
    base = interconnect.removesuffix(INTERNODE)
    if gpu not in INTERCONNECTS:
        raise ValueError(f"gpu: no network profiles for {gpu!r}; have {sorted(INTERCONNECTS)}")
    if base not in INTERCONNECTS[gpu]:
        raise ValueError(f"interconnect: {interconnect!r} is not one for gpu {gpu!r}; use one of "
                         f"{INTERCONNECTS[gpu]}, optionally with {INTERNODE!r}")
    if tp > 8:
        raise ValueError(f"tp: {tp} GPUs do not fit one node; TP spans at most 8")
    family = "h100" if gpu == "h200" else gpu
    if family == "a40":
        all_reduce, send_recv = "network/a40/all_reduce.csv.gz", "network/a40_pairwise_nvlink/send_recv.csv.gz"
    else:
        fabric = "dgx" if base == "dgx" or tp > NODE_GPUS else "pairwise_nvlink"
        all_reduce = f"network/{family}_{fabric}/all_reduce.csv.gz"
        send_recv = f"network/{family}_{'dgx' if base == 'dgx' else 'pairwise_nvlink'}/send_recv.csv.gz"
    internode = interconnect.endswith(INTERNODE)
    tp_per_node = min(tp, NODE_GPUS) if internode else tp
    return (all_reduce if tp > 1 else None), tp_per_node, send_recv, (1 if internode else 2)


@dataclass(frozen=True)
class CommModel:
    all_reduce: SizeCurve | None   # None at TP 1
    send_recv: SizeCurve
    hidden_size: int

    @classmethod
    def build(cls, gpu: str, interconnect: str, tp: int, hidden_size: int) -> CommModel:
        all_reduce, tp_per_node, send_recv, devices_per_node = profile_files(gpu, interconnect, tp)
        return cls(SizeCurve.load(all_reduce, tp, tp_per_node) if all_reduce else None,
                   SizeCurve.load(send_recv, 2, devices_per_node), hidden_size)

    def all_reduce_seconds(self, num_tokens: int) -> float:
        if self.all_reduce is None or num_tokens == 0:
            return 0.0
        return self.all_reduce.at(num_tokens * self.hidden_size * DTYPE_BYTES)

    def send_seconds(self, num_tokens: int) -> float:
        return self.send_recv.at(num_tokens * self.hidden_size * DTYPE_BYTES) if num_tokens else 0.0
