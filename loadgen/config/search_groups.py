"""The groups of the bench config that shape a search: ``capacity`` (mode=capacity, compare and tune),
``compare`` (mode=compare) and ``tune`` (mode=tune); and ``positive``, the range check the bench config's groups share."""
from __future__ import annotations

import dataclasses
import math
import string
from dataclasses import dataclass

from stallfree.engine.config_checks import ConfigError, is_int, is_number, require


def positive(key: str, value: float | None, optional: bool = False) -> None:
    if not (optional and value is None):
        require(is_number(value) and value > 0, key, "a number > 0" + (" or null" if optional else ""), value)


@dataclass
class CapacityGroup:
    """mode=capacity (loadgen.sweep.capacity_search; the rules a point passes: loadgen.sweep.keep_pace)."""

    start_qps: float
    min_qps: float
    max_qps: float
    tolerance: float
    max_p50_scheduling_delay_s: float
    min_completion_ratio: float  # completion rate / offered rate over the steady window
    max_delay_growth_s: float  # client-side scheduling delay: last third - first third of the steady window
    min_duration_s: float  # a point at qps q sends max(num_requests, q x min_duration_s) requests ...
    max_requests: int  # ... and at most this many
    min_requests_per_in_flight: float  # a point sends at least this many times its peak in-flight requests
    # times a point whose verdict hangs on an unsure P99 TBT (its 95% interval straddles the SLO, no other rule
    # failed) is measured again with twice the requests, at most max_requests, before it decides the search
    unsure_remeasures: int = 1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "unsure_remeasures":
                positive(f"capacity.{f.name}", getattr(self, f.name))
        require(is_int(self.unsure_remeasures) and self.unsure_remeasures >= 0, "capacity.unsure_remeasures",
                "an integer >= 0", self.unsure_remeasures)
        require(self.min_qps <= self.start_qps <= self.max_qps, "capacity.start_qps",
                f"within [capacity.min_qps={self.min_qps}, capacity.max_qps={self.max_qps}]", self.start_qps)
        require(self.min_completion_ratio <= 1, "capacity.min_completion_ratio", "a number in (0, 1]",
                self.min_completion_ratio)
        need = math.ceil(self.max_qps * self.min_duration_s)
        require(self.max_requests >= need, "capacity.max_requests",
                f">= capacity.max_qps x capacity.min_duration_s = {need} (a point at max_qps sends that many "
                "requests to last min_duration_s; lower max_qps or min_duration_s, or raise max_requests)",
                self.max_requests)

    def num_requests(self, qps: float, num_requests: int) -> int:
        """The requests of a point at ``qps``: enough to last min_duration_s, at least num_requests."""
        return min(max(num_requests, math.ceil(qps * self.min_duration_s)), self.max_requests)

    def doubled(self, num_requests: int) -> int:
        """The requests of a point measured again for an unsure TBT verdict: twice as many, at most max_requests."""
        return min(2 * num_requests, self.max_requests)

    def longer(self, num_requests: int, peak_in_flight: int) -> int:
        """The requests of a point measured again because its ``num_requests`` were fewer than
        min_requests_per_in_flight x its peak in-flight requests: that many, and at least twice as many (a
        server falling behind keeps more in flight the longer it runs), at most max_requests."""
        return max(self.doubled(num_requests),
                   min(math.ceil(self.min_requests_per_in_flight * peak_in_flight), self.max_requests))


@dataclass
class CompareGroup:
    """mode=compare (conf/experiment/compare.yaml): the job's contender (conf/contender/) and the QPS points
    it measures before its capacity search (loadgen.sweep.side_by_side)."""

    qps: list[float]
    contender: str  # its file name, set by the contender's config
    vllm_url: str | None = None  # the vllm_url contender's server

    def __post_init__(self) -> None:
        require(bool(self.qps) and all(is_number(q) and q > 0 for q in self.qps), "compare.qps",
                "a non-empty list of numbers > 0", self.qps)


@dataclass
class TuneGroup:
    """mode=tune (``stallfree-tune``, conf/experiment/tune.yaml; loadgen.sweep.tune): the grid of server settings
    searched for the most capacity under the SLO, and how many of the best simulated ones are confirmed live."""

    policies: list[str]
    chunk_sizes: list[int]  # the token budgets of the chunked policies (the others admit whole prompts)
    max_num_seqs: list[int] | None = None  # None: the config's scheduler.max_num_seqs only
    confirm: int = 2  # the best simulated settings measured live (the config's own setting is measured too)
    cost_model: str | None = None  # the simulation's; None: the model's cost model (model.cost_model or a profile)
    max_minutes: float | None = None  # the live searches' budget: settings beyond it are dropped, named
    # A server that is not ours, started once per setting with its settings as launch flags, e.g.
    # "vllm serve DIR --port {port} --max-num-batched-tokens {chunk_size}" (loadgen.sweep.tune_serve)
    serve_cmd: str | None = None

    def __post_init__(self) -> None:
        from stallfree.engine.records.policies import POLICIES

        require(bool(self.policies) and all(p in POLICIES for p in self.policies), "tune.policies",
                f"a non-empty list of {list(POLICIES)}", self.policies)
        for key in ("chunk_sizes", "max_num_seqs"):
            values = getattr(self, key)
            require(values is None or (bool(values) and all(is_int(v) and v >= 1 for v in values)), f"tune.{key}",
                    "a non-empty list of integers >= 1" + (" or null" if key == "max_num_seqs" else ""), values)
        require(is_int(self.confirm) and self.confirm >= 0, "tune.confirm", "an integer >= 0", self.confirm)
        positive("tune.max_minutes", self.max_minutes, optional=True)
        if self.serve_cmd is not None:
            keys = serve_keys(self.serve_cmd)
            require("port" in keys, "tune.serve_cmd", "a command with {port} (where the server listens)",
                    self.serve_cmd)
            unknown = sorted(keys - set(SERVE_KEYS))
            require(not unknown, "tune.serve_cmd", f"a command whose {{keys}} are among {list(SERVE_KEYS)}, which the "
                    f"tune sets (not {unknown})", self.serve_cmd)
            require("max_num_seqs" not in keys or self.max_num_seqs is not None, "tune.max_num_seqs",
                    "a list for a tune.serve_cmd with {max_num_seqs}", self.max_num_seqs)


SERVE_KEYS = ("port", "chunk_size", "max_num_seqs")  # what a tune.serve_cmd may name


def serve_keys(command: str) -> set[str]:
    """The ``{keys}`` of a command template; ConfigError for one that is not a template."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(command) if name is not None}
    except ValueError as e:
        raise ConfigError(f"tune.serve_cmd must be a command template ({e}), got {command!r}") from None
