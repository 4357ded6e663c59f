"""Utilisation of the hardware per iteration: model FLOPs and bytes from the shapes (work.py), this machine's
limits (measured_limits.py), and the sampled operator split (op_split.py). ``UtilizationMeter`` turns an iteration into
the MFU / MBU / split fields of its BatchRecord."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from stallfree.engine.utilization.measured_limits import MachineLimits, machine_limits
from stallfree.engine.utilization.op_split import OperatorSplit, SplitSampler
from stallfree.engine.utilization.work import IterationWork, ModelCounts

__all__ = ["IterationWork", "MachineLimits", "ModelCounts", "OperatorSplit", "SplitSampler", "UtilizationMeter", "make_meter",
           "machine_limits"]

log = logging.getLogger(__name__)


class UtilizationMeter:
    """``limits`` None (unknown): the records carry FLOPs and bytes, not MFU and MBU."""

    def __init__(self, counts: ModelCounts, limits: MachineLimits | None):
        self.counts, self.limits = counts, limits

    def fields(self, units: Sequence, seconds: float, split: OperatorSplit | None) -> dict:
        """The utilisation fields of a BatchRecord for an iteration of ``units`` that took ``seconds``."""
        work = self.counts.work(units)
        out = {"model_flops": work.flops, "bytes_moved": work.bytes_moved}
        if self.limits is not None and seconds > 0:
            self._raise_peak(work.flops / seconds)
            out["mfu"] = work.flops / (seconds * self.limits.peak_flops)
            out["mbu"] = work.bytes_moved / (seconds * self.limits.bandwidth)
        if split is not None:
            out |= {"linear_s": split.linear_s, "attention_s": split.attention_s,
                    "other_s": seconds - split.linear_s - split.attention_s}
        return out

    def _raise_peak(self, flop_rate: float) -> None:
        """An iteration's FLOP rate is one this machine reaches: a best-of measurement of the peak below it was
        low, so the peak becomes that rate (MFU at most 1). Bytes are left alone: a model whose weights fit in
        the caches reads faster than memory, which is no limit measured low."""
        if flop_rate > self.limits.peak_flops:
            log.info("an iteration ran at %.4g FLOP/s, above the measured peak %.4g: the peak is raised to it",
                     flop_rate, self.limits.peak_flops)
            self.limits = dataclasses.replace(self.limits, peak_flops=flop_rate)


def make_meter(runner_kind: str, runner, arch, device, dtype, weight_dtype=None) -> UtilizationMeter:
    """The real runner is measured against this machine's limits (cached per machine); another runner (a
    simulated deployment) may name its hardware's published ones as ``runner.machine_limits``. Limits
    measured on a busy machine are low, and a utilisation against them could pass 1: none is reported.
    ``weight_dtype``: the linears' stored weights where they differ from ``dtype`` (the bytes a step reads)."""
    limits = machine_limits(device, dtype) if runner_kind == "model" else runner.machine_limits
    if limits is not None and limits.busy:
        log.warning("MFU and MBU not reported: the machine limits (%s) were %s; measure them again on a quiet "
                    "machine: python -m stallfree.engine.utilization.measured_limits --refresh", limits.device,
                    limits.source)
        limits = None
    return UtilizationMeter(ModelCounts.of(arch, dtype.itemsize, (weight_dtype or dtype).itemsize), limits)
