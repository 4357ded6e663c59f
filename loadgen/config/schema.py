"""The typed stallfree-bench config: the engine's EngineConfig (its sections ``model``, ``cache``,
``scheduler``: the schema conf/bench.yaml starts from) extended with one dataclass per group of the bench,
each checking its own ranges. ``load_bench`` turns a composed config into a BenchConfig once, at the entry point
(loadgen.config.checks); everything inward takes it, never the raw Hydra config (run ids hash it).

Settings named by a kind (``workload.lengths``, ``model.deployment``, ``study``) stay mappings: the function
of their kind checks them (loadgen.workload.request_specs, engine/simulator, loadgen.studies.catalog).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stallfree.engine import EngineConfig
from stallfree.engine.config_checks import ConfigError, is_int, is_number, require
from stallfree.engine.hydra_config import CONF_DIR, check_engine, cost_model_file, register_schema, typed
from stallfree.loadgen.config.search_groups import CapacityGroup, CompareGroup, TuneGroup, positive

register_schema()  # conf/bench.yaml starts from it: composing it, anywhere, needs this module
MODES = ("run", "capacity", "study", "compare", "tune")
RERUN = ("none", "disturbed", "all")
REFERENCE_PROBES = ("target", "stallfree")  # slo.reference_probe
AUTO_SWITCH = ("auto", "true", "false")
DISPATCH_KEYS = ("max_concurrency",)
OLD_CAP_TARGETS = ("http", "url")  # their target.max_in_flight is the old spelling of arrival.max_concurrency
G = TypeVar("G")


@dataclass
class WorkloadGroup:
    name: str
    # kind and its settings (loadgen.workload.request_specs.LENGTHS, text_prompts.TEXT_WORKLOADS,
    # prefix_reuse.PROMPT_WORKLOADS)
    lengths: dict[str, Any]
    max_total_tokens: int | None = None
    tokenizer: str | None = None  # counts a text workload's tokens; None: the model's own

    def __post_init__(self) -> None:
        require(self.tokenizer is None or Path(self.tokenizer).expanduser().is_dir(), "workload.tokenizer",
                "a tokenizer directory or null", self.tokenizer)


@dataclass
class ArrivalGroup:
    """An arrival process (loadgen.workload.request_specs.ARRIVALS); each kind takes some of the settings."""

    kind: str
    qps: float | None = None
    cv: float | None = None
    burstiness: float | None = None
    name: str | None = None
    time_scale: float | None = None
    # at most this many requests in flight: a request due while the cap is reached waits in the client for a
    # slot (vLLM's --max-concurrency; with kind burst a closed loop, GuideLLM's concurrent profile)
    max_concurrency: int | None = None
    # the rate rises from start to end over the run (loadgen.workload.ramp; qps is then ignored)
    ramp_up_strategy: str | None = None  # linear | exponential
    ramp_up_start_qps: float | None = None
    ramp_up_end_qps: float | None = None

    def __post_init__(self) -> None:
        require(self.max_concurrency is None or (is_int(self.max_concurrency) and self.max_concurrency >= 1),
                "arrival.max_concurrency", "an integer >= 1 or null", self.max_concurrency)

    def settings(self) -> dict:
        """``build_workload``'s arrival: the kind and the settings given (the send times' process; the cap is
        the dispatcher's)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k not in DISPATCH_KEYS}


@dataclass
class TargetGroup:
    """Where runs replay (loadgen.targets.TARGETS, which names an unknown kind as the run's target is made);
    each kind reads some of the settings."""

    kind: str
    timeout_s: float = 600.0
    url: str | None = None  # a running server (url, locust)
    served_model: str | None = None
    label: str | None = None
    host: str = "127.0.0.1"  # a server the bench starts (http, locust)
    port: int = 0
    startup_timeout_s: float = 180.0
    workers: int = 1  # locust processes
    max_in_flight: int | None = None
    endpoint: str | None = None  # None: no HTTP (inprocess)
    client_nice: int = 0  # http: the client replays this much nicer than the bench, giving way to its server
    token_ids: str = "auto"  # HTTP: token-id prompts (true), text (false), or token ids when the server takes them
    ignore_eos: str = "auto"  # HTTP: send ignore_eos (true), never (false), or when the server takes it
    tokenizer: str | None = None  # url, locust: text prompts of the workload's lengths (None: the workload's)
    metrics_interval_s: float | None = 0.5  # http, url, locust: the server's /metrics scraped this often; None: never

    def __post_init__(self) -> None:
        from stallfree.loadgen.openai_client.completions import ENDPOINT_PATHS

        positive("target.timeout_s", self.timeout_s)
        require(self.max_in_flight is None or self.max_in_flight >= 1, "target.max_in_flight",
                "an integer >= 1 or null", self.max_in_flight)
        require(self.endpoint is None or self.endpoint in ENDPOINT_PATHS, "target.endpoint",
                f"one of {sorted(ENDPOINT_PATHS)}", self.endpoint)
        positive("target.metrics_interval_s", self.metrics_interval_s, optional=True)
        require(0 <= self.client_nice <= 19, "target.client_nice", "an integer in [0, 19]", self.client_nice)
        for key in ("token_ids", "ignore_eos"):  # YAML's true / false arrive as "True" / "False"
            setattr(self, key, str(getattr(self, key)).lower())
            require(getattr(self, key) in AUTO_SWITCH, f"target.{key}", "auto, true or false", getattr(self, key))
        require(self.tokenizer is None or Path(self.tokenizer).expanduser().is_dir(), "target.tokenizer",
                "a tokenizer directory or null", self.tokenizer)

    def switch(self, key: str) -> str | bool:
        """``token_ids`` / ``ignore_eos`` as loadgen.targets.server_check.probe_request_shape takes it."""
        value = getattr(self, key)
        return value if value == "auto" else value == "true"


@dataclass
class SloGroup:
    """The SLO of a run (loadgen.sweep.slo) and of the Locust LLM tab (loadgen.locust.llm_stats)."""

    name: str
    tbt_multiple: float
    tbt_ms: float | None = None
    reference_ms: float | None = None
    reference_cost_model: str | None = None
    # what the decode probe measures: the run's target, or stallfree's own engine with the run's model in this
    # process (one reference of this machine for every contender of a comparison, whatever each serves with)
    reference_probe: str = "target"
    ttft_ms: float | None = None
    goodput: str | None = None

    def __post_init__(self) -> None:
        from stallfree.engine.records.request_metrics import parse_goodput

        positive("slo.tbt_multiple", self.tbt_multiple)
        require(self.reference_probe in REFERENCE_PROBES, "slo.reference_probe", f"one of {REFERENCE_PROBES}",
                self.reference_probe)
        for key in ("tbt_ms", "reference_ms", "ttft_ms"):
            positive(f"slo.{key}", getattr(self, key), optional=True)
        try:
            parse_goodput(self.goodput)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.reference_cost_model is not None:
            cost_model_file(self.reference_cost_model, "slo.reference_cost_model")

    def tbt_bound_ms(self, decode_iter_ms: float | None) -> float | None:
        """The P99 TBT bound: ``tbt_ms``, else ``tbt_multiple`` x the decode reference (None: not known)."""
        if self.tbt_ms is not None:
            return self.tbt_ms
        return None if decode_iter_ms is None else self.tbt_multiple * decode_iter_ms


@dataclass
class DecodeProbe:
    num_seqs: int
    prompt_tokens: int
    output_tokens: int
    rounds: int
    quantile: float
    max_spread: float
    attempts: int

    def __post_init__(self) -> None:
        for key in ("num_seqs", "prompt_tokens", "output_tokens", "rounds", "attempts"):
            require(getattr(self, key) >= 1, f"decode_probe.{key}", "an integer >= 1", getattr(self, key))
        require(is_number(self.quantile) and 0 <= self.quantile <= 1, "decode_probe.quantile", "a number in [0, 1]",
                self.quantile)
        positive("decode_probe.max_spread", self.max_spread)


@dataclass(kw_only=True)
class BenchConfig(EngineConfig):
    """conf/bench.yaml, checked (see the module docstring): the engine's sections, then the bench's."""

    workload: WorkloadGroup
    arrival: ArrivalGroup
    target: TargetGroup
    slo: SloGroup
    decode_probe: DecodeProbe
    capacity: CapacityGroup
    experiment_name: str
    mode: str
    qps: float
    seed: int
    repeats: int
    num_requests: int
    warmup: int
    results_dir: str
    min_engine_cpu_share: float
    rerun: str
    study: dict[str, Any] | None = None  # mode=study (loadgen.studies.catalog checks it)
    compare: CompareGroup | None = None  # mode=compare
    tune: TuneGroup | None = None  # mode=tune

    def __post_init__(self) -> None:
        from stallfree.loadgen.workload.request_specs import is_text_workload

        super().__post_init__()
        check_engine(self)
        require(self.mode in MODES, "mode", f"one of {list(MODES)}", self.mode)
        require(self.mode != "compare" or self.compare is not None, "mode",
                "'compare' only with +experiment=compare (it sets compare.qps)", self.mode)
        require(self.mode != "tune" or self.tune is not None, "mode",
                "'tune' only with +experiment=tune or stallfree-tune (it sets the tune group)", self.mode)
        if self.mode == "tune" and self.tune.serve_cmd is None:
            require(self.target.kind in ("inprocess", "http"), "target", "inprocess or http in mode=tune (the "
                    "tuner sets our engine's settings; another server's are its launch flags: tune.serve_cmd)",
                    self.target.kind)
        if self.mode == "tune" and self.tune.serve_cmd is not None:
            require(self.target.kind == "url", "target", "url with tune.serve_cmd (the command's server, started "
                    "on target.url's port for each setting)", self.target.kind)
        split = self.parallel.data_parallel_size > 1 or self.parallel.disaggregation is not None
        require(self.mode != "study" or not split, "mode", "other than 'study' with parallel.data_parallel_size > 1 "
                "or parallel.disaggregation (a study reshapes one engine's iterations)", self.mode)
        require(self.rerun in RERUN, "rerun", f"one of {list(RERUN)}", self.rerun)
        self._settle_offered_load()
        positive("qps", self.qps)
        for key in ("num_requests", "repeats"):
            require(getattr(self, key) >= 1, key, "an integer >= 1", getattr(self, key))
        require(0 <= self.warmup < self.num_requests, "warmup", f"an integer in [0, num_requests={self.num_requests})",
                self.warmup)
        require(self.model.clock == "real" or self.target.kind == "inprocess", "model.clock",
                "'real' unless target=inprocess (a server's virtual time means nothing to a client)", self.model.clock)
        require(is_number(self.min_engine_cpu_share) and 0 <= self.min_engine_cpu_share <= 1, "min_engine_cpu_share",
                "a number in [0, 1]", self.min_engine_cpu_share)
        require(self.target.endpoint != "chat" or is_text_workload(self.workload.lengths), "target.endpoint",
                "completions for a workload of token ids (chat needs a text workload: sharegpt, jsonl, sonnet)",
                self.target.endpoint)
        self._settle_concurrency_cap()
        if self.mode in ("capacity", "compare", "tune"):  # all search a capacity
            require(self.arrival.qps is not None, "arrival", "a process driven by qps (poisson, gamma, constant) in "
                    f"mode={self.mode}", self.arrival.kind)
            require(self.arrival.ramp_up_strategy is None, "arrival.ramp_up_strategy",
                    f"null in mode={self.mode} (the search sets the rate)", self.arrival.ramp_up_strategy)
            require(self.num_requests <= self.capacity.max_requests, "num_requests",
                    f"<= capacity.max_requests={self.capacity.max_requests} in mode={self.mode}", self.num_requests)

    def _settle_concurrency_cap(self) -> None:
        """``target.max_in_flight`` of an HTTP target is the old spelling of ``arrival.max_concurrency``: it
        still works, with a hint. Locust's own cap drops arrivals instead, and its users are its closed loop."""
        old = self.target.max_in_flight if self.target.kind in OLD_CAP_TARGETS else None
        if old is not None:
            require(self.arrival.max_concurrency in (None, old), "target.max_in_flight",
                    f"unset (it is the old spelling of arrival.max_concurrency={self.arrival.max_concurrency})", old)
            print(f"[config] target.max_in_flight={old} is arrival.max_concurrency={old} now", flush=True)
            self.arrival.max_concurrency, self.target.max_in_flight = old, None
        require(self.arrival.max_concurrency is None or self.target.kind != "locust", "arrival.max_concurrency",
                "null with target=locust (Locust's users are its closed loop; target.max_in_flight drops arrivals "
                "over a cap)", self.arrival.max_concurrency)

    def _settle_offered_load(self) -> None:
        """``arrival.qps`` set apart from ``qps`` is the load offered: ``qps`` (run id, summary) takes it."""
        if self.arrival.qps is not None and self.arrival.qps != self.qps:
            print(f"[config] arrival.qps={self.arrival.qps:g} sets qps (the key naming the load)", flush=True)
            self.qps = self.arrival.qps

    @property
    def virtual_time(self) -> bool:
        """A simulated engine on a virtual clock: its times do not depend on the CPU it gets."""
        return self.model.runner == "simulated" and self.model.clock == "virtual"

    def with_qps(self, qps: float) -> BenchConfig:
        """The same config at another offered load (the arrival process's rate, ``${qps}`` in conf/arrival/,
        follows it)."""
        arrival = dataclasses.replace(self.arrival, qps=qps if self.arrival.qps is not None else None)
        return dataclasses.replace(self, qps=qps, arrival=arrival)


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Keys left at ``???``, without resolving interpolations (which would fail on them first)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _missing_keys(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if node == "???" else []


def load_bench(cfg: Mapping) -> BenchConfig:
    """A composed bench config (a DictConfig) as a BenchConfig; ConfigError names the first bad key.
    Top-level keys the schema does not know are the lookup tables of presets (``paper``, ``ablation_qps``):
    they only feed interpolations."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    missing = _missing_keys(OmegaConf.to_container(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required (set {missing[0]}=...)")
    try:
        composed = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{e.full_key}: {str(e).splitlines()[0]}") from None
    names = {f.name for f in dataclasses.fields(BenchConfig)}
    return typed(BenchConfig, {k: v for k, v in composed.items() if k in names})


def load_group(group: str, option: str, schema: type[G]) -> G:
    """conf/<group>/<option>.yaml on its own (a group without a defaults list or interpolations), typed."""
    from omegaconf import OmegaConf

    return typed(schema, OmegaConf.load(CONF_DIR / group / f"{option}.yaml"), f"{group}.")
