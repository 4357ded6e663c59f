"""RunSummary: one run's summary.json, typed and versioned, built of the parts in summary_parts.py.

summary.json stays flat (the keys analysis, the notebooks and summary.parquet read): ``flat()`` writes the
parts' fields in order, ``summary_version`` first; ``from_flat`` takes them back, and a key that no part
declares is a SummaryError naming it, so a key is added to its part and nowhere else. ``read_summary`` reads
every version this code knows: version 1 (no ``summary_version``, before the policy and the engine label were
apart) gains ``policy`` from ``scheduler``; a newer version than this code's is an error that says so.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from stallfree.engine.records.request_metrics import LATENCY_METRICS
from stallfree.engine.records.summary_parts import (
    ClientPace,
    CpuReport,
    KvTransfers,
    LatencyStats,
    OutputLengths,
    PipelineSummary,
    Placement,
    RequestTotals,
    RunParams,
    ServerSummary,
    SessionResults,
    SloSummary,
)

SUMMARY_VERSION = 2
VERSION_KEY = "summary_version"
# the flat parts, in the order their keys are written (the latency statistics follow the totals)
FLAT_PARTS = {"params": RunParams, "slo": SloSummary, "totals": RequestTotals, "pace": ClientPace,
              "sessions": SessionResults, "output_lengths": OutputLengths, "pipeline": PipelineSummary,
              "cpu": CpuReport, "server": ServerSummary, "placement": Placement,
              "kv_transfers": KvTransfers}
STATS = {f.name: f.name.replace("p99_9", "p99.9") for f in dataclasses.fields(LatencyStats)}


class SummaryError(ValueError):
    """A summary this code cannot read: a key no part declares, or a newer version."""


def latency_key(stat: str, metric: str) -> str:
    """The flat key of one statistic (a LatencyStats field) of one metric: mean_ttft_ms, p99.9_tbt_ms, ..."""
    return f"{STATS[stat]}_{metric}_ms"


def _clean(value):
    """summary.json values: numpy scalars as Python numbers, NaN as null."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


@dataclass
class RunSummary:
    params: RunParams = field(default_factory=RunParams)
    slo: SloSummary = field(default_factory=SloSummary)
    totals: RequestTotals = field(default_factory=RequestTotals)
    latency: dict[str, LatencyStats] = field(default_factory=lambda: {m: LatencyStats() for m in LATENCY_METRICS})
    pace: ClientPace = field(default_factory=ClientPace)
    sessions: SessionResults = field(default_factory=SessionResults)
    output_lengths: OutputLengths = field(default_factory=OutputLengths)
    pipeline: PipelineSummary = field(default_factory=PipelineSummary)
    cpu: CpuReport = field(default_factory=CpuReport)
    server: ServerSummary = field(default_factory=ServerSummary)
    placement: Placement = field(default_factory=Placement)
    kv_transfers: KvTransfers = field(default_factory=KvTransfers)
    version: int = SUMMARY_VERSION

    @classmethod
    def from_flat(cls, flat: dict, source: str = "summary") -> RunSummary:
        """The summary of flat keys (a missing key is None); SummaryError naming ``source`` and any key no part
        declares."""
        rest = {key: _clean(value) for key, value in flat.items() if key != VERSION_KEY}
        parts = {name: part(**{f.name: rest.pop(f.name) for f in dataclasses.fields(part) if f.name in rest})
                 for name, part in FLAT_PARTS.items()}
        latency = {metric: LatencyStats(**{stat: rest.pop(latency_key(stat, metric), None) for stat in STATS})
                   for metric in LATENCY_METRICS}
        if rest:
            raise SummaryError(f"{source}: unknown key(s) {', '.join(sorted(rest))} (a summary key is a field of a "
                               "part in stallfree/engine/records/summary_parts.py)")
        return cls(**parts, latency=latency, version=flat.get(VERSION_KEY, SUMMARY_VERSION))

    def flat(self) -> dict:
        """summary.json's keys and values, ``summary_version`` first."""
        out: dict = {VERSION_KEY: self.version}
        for name in FLAT_PARTS:
            out.update(dataclasses.asdict(getattr(self, name)))
            if name == "totals":
                out.update({latency_key(stat, metric): getattr(stats, stat)
                            for metric, stats in self.latency.items() for stat in STATS})
        return out

    def to_json(self) -> str:
        return json.dumps(self.flat(), indent=2, default=str) + "\n"


def upgrade(flat: dict, source: str) -> dict:
    """Flat keys of any known version as the current version's."""
    version = flat.get(VERSION_KEY, 1)
    if version > SUMMARY_VERSION:
        raise SummaryError(f"{source}: summary version {version} is newer than this stallfree's "
                           f"({SUMMARY_VERSION}); upgrade stallfree to read it")
    if version == 1:  # the policy and the engine label were one key, scheduler
        flat = {**flat, "policy": None if flat.get("engine_label") else flat.get("scheduler")}
    return {**flat, VERSION_KEY: SUMMARY_VERSION}


def read_summary(path: str | Path) -> RunSummary:
    """A run's summary.json, of any version this code knows."""
    return RunSummary.from_flat(upgrade(json.loads(Path(path).read_text()), str(path)), str(path))
