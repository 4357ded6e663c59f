"""Per-iteration CPU overhead: scheduling, preparing the inputs, sampling and processing the outputs,
from Vidur's profiles of a vLLM-based engine (``cpu_overhead/{a100,a40}.csv``: medians per iteration by
batch size 8-128, per model and TP).

The sum of the four medians is fitted as ``a + b x batch size`` over every profiled model at the
deployment's TP (the profile's nearest TP below it when that TP was not profiled: the A100 host has TP
1, 2 and 4). Host costs belong to the host, not the GPU: H100 and H200 deployments use the A100 host's
profile. Ray's driver-to-worker messaging (``ray_comm_time``, 2-8 ms at TP > 1 in Vidur's profile) is left
out: it is the cost of vLLM 0.2's Ray workers, not of scheduling.
"""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.simulator.ops import profile_data

COLUMNS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")


def profile_file(gpu: str) -> str:
    return "cpu_overhead/a40.csv.gz" if gpu == "a40" else "cpu_overhead/a100.csv.gz"


@dataclass(frozen=True)
class CpuOverheadModel:
    fixed_s: float
    per_seq_s: float
    profiled_tp: int

    @classmethod
    def build(cls, gpu: str, tp: int) -> CpuOverheadModel:
        rows = profile_data.rows(profile_file(gpu))
        tps = sorted({int(r["tensor_parallel_degree"]) for r in rows})
        chosen = max([t for t in tps if t <= tp], default=tps[0])
        points = [(float(r["batch_size"]), sum(profile_data.ms(r[c]) for c in COLUMNS))
                  for r in rows if int(r["tensor_parallel_degree"]) == chosen]
        n = len(points)
        mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
                 / sum((x - mean_x) ** 2 for x, _ in points))
        return cls(mean_y - slope * mean_x, slope, chosen)

    def seconds(self, num_seqs: int) -> float:
        return self.fixed_s + self.per_seq_s * num_seqs
