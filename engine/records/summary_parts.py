"""The parts of a run's summary (RunSummary, engine/records/run_summary.py): each field is one key of
summary.json, declared here once with its type; docs/results.md's tables are generated from these classes.

The latency statistics are the one part that is not flat: LatencyStats per metric, written as
``<stat>_<metric>_ms`` (vLLM's benchmark names: ``mean_ttft_ms``, ``p99.9_tbt_ms``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunParams:
    experiment: str | None = None
    run_id: str | None = None
    # the policy for the bench's own engine, else the server's label (kept for the figures that group by it)
    scheduler: str | None = None
    policy: str | None = None  # the engine's scheduling policy; None for a server the bench did not start
    engine_label: str | None = None  # what a server the bench did not start says it is, e.g. vllm 0.32.0 (url)
    chunk_size: int | None = None
    model: str | None = None
    prefix_caching: bool | None = None  # whether the engine cached prefixes; None for target=url
    qps: float | None = None
    point_id: str | None = None  # the same for the repeats of a point on other seeds
    dtype: str | None = None  # what the engine computes in (model.dtype resolved here); None for target=url
    target: str | None = None
    workload: str | None = None
    arrival: str | None = None
    seed: int | None = None
    num_requests: int | None = None
    capacity_search: str | None = None  # the SLO name, for the points of a capacity search
    rerun: int | None = None  # 1: the second measurement of a disturbed point


@dataclass
class SloSummary:
    slo_name: str | None = None
    slo_tbt_ms: float | None = None
    decode_iter_ms: float | None = None  # None for an absolute slo.tbt_ms
    slo_reference_method: str | None = None  # absolute, pinned, cost_model, probe
    slo_reference_disturbed: bool | None = None
    slo_reference_spread: float | None = None  # the probe's two measurements: |a - b| / min
    slo_reference_measurements_ms: list[float] | None = None
    slo_reference_measured_at: str | None = None  # UTC; the same reference for every run of the experiment
    slo_reference_measured_on: str | None = None  # the CPU a probe ran from, or a cost model was fitted on
    slo_ttft_ms: float | None = None
    slo_e2e_ms: float | None = None
    slo_goodput: str | None = None  # the slo.goodput SLOs, e.g. "ttft:500 tpot:50"
    # what the P99 TBT verdict rests on (engine/records/quantile_bounds.py): the token gaps and the ok requests
    # they came from, and the order statistics that bound the true P99 with 95% confidence; a bound the samples
    # are too few to give is None (an upper one needs about 370 gaps)
    tbt_gaps: int | None = None
    tbt_requests: int | None = None
    tbt_prefill_gaps: int | None = None  # of the gaps, those that ended in an iteration with prefill work
    p99_tbt_low_ms: float | None = None
    p99_tbt_high_ms: float | None = None


@dataclass
class RequestTotals:
    prompt_form: str | None = None  # text | token_ids
    ignore_eos: bool | None = None
    failed_run: bool | None = None  # requests lost the connection to the target: it died mid-run
    failed_reason: str | None = None
    completed: int | None = None
    failed: int | None = None
    duration: float | None = None  # last finish - first intended send (s)
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    request_goodput: float | None = None  # ok requests per second that meet every given SLO
    request_goodput_vllm: float | None = None  # vLLM's goodput over slo.goodput; None without it


@dataclass
class LatencyStats:
    """One metric's statistics over the measured ok requests (ms)."""

    mean: float | None = None
    std: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None  # written p99.9


@dataclass
class ClientPace:
    schedule_lag_p50_ms: float | None = None
    schedule_lag_p99_ms: float | None = None
    schedule_lag_max_ms: float | None = None
    client_wait_p50_ms: float | None = None  # the client waits under arrival.max_concurrency; None without it
    client_wait_p99_ms: float | None = None
    client_wait_max_ms: float | None = None
    mean_client_wait_ms: float | None = None
    offered_rate: float | None = None
    achieved_rate: float | None = None
    client_fell_behind: bool | None = None
    steady_offered_rate: float | None = None
    steady_completion_rate: float | None = None
    completion_ratio: float | None = None
    completion_method: str | None = None
    peak_in_flight: int | None = None
    arrival_window_s: float | None = None
    median_client_scheduling_delay_ms: float | None = None  # capacity-search points only
    client_scheduling_delay_growth_ms: float | None = None


@dataclass
class SessionResults:
    num_sessions: int | None = None  # all None for a workload without sessions
    sessions_completed: int | None = None
    sessions_failed: int | None = None
    sessions_context_limit: int | None = None
    mean_turns_per_session: float | None = None
    median_session_duration_s: float | None = None
    p90_session_duration_s: float | None = None
    median_ttft_first_turn_ms: float | None = None
    p90_ttft_first_turn_ms: float | None = None
    median_ttft_follow_up_ms: float | None = None
    p90_ttft_follow_up_ms: float | None = None


@dataclass
class OutputLengths:
    early_stop_fraction: float | None = None
    requested_output_tokens: int | None = None
    served_output_tokens: int | None = None
    output_length_histogram: dict[str, int] | None = None


@dataclass
class PipelineSummary:
    pipeline_bubble_fraction: float | None = None  # stages' idle / (busy + idle); None without stages
    pipeline_stages: int | None = None


@dataclass
class CpuReport:
    """The CPU the engine and the load generator got during the replay (loadgen/sweep/cpu_share.py)."""

    # ran / (ran + waited runnable), over the engine's threads; None: it asked for nothing, or runs elsewhere
    engine_cpu_share: float | None = None
    engine_cpu_s: float | None = None  # None (as for the other engine fields): the engine runs elsewhere (target=url)
    engine_run_delay_s: float | None = None
    engine_threads: int | None = None
    engine_cpu_per_thread_wall: float | None = None  # engine CPU time / (wall x threads)
    # the load generator's CPU time, and that / all CPU time; None when it runs in the engine's process
    loadgen_cpu_s: float | None = None
    loadgen_cpu_share: float | None = None
    # ran / (ran + waited runnable) over the load generator's threads, measured when the engine runs elsewhere
    loadgen_sched_share: float | None = None
    others_cpu_share: float | None = None  # busy CPU time of other processes / all CPU time
    steal_share: float | None = None
    load_avg_1m: float | None = None
    wall_s: float | None = None
    disturbed: bool | None = None  # never on a virtual clock
    disturbed_reason: str | None = None  # which side got too little of the CPU it asked for
    loadgen_cpu_ms_per_request: float | None = None  # the load generator's CPU time per request sent


@dataclass
class Placement:
    """Where the load generator and the engine of a run could run, taken as the replay starts."""

    # inprocess: the engine is this process, the load generator runs in its thread between steps;
    # subprocess: a server this process started; external: a server it did not start (not looked at)
    cpu_placement: str | None = None
    loadgen_cpus: list[int] | None = None  # the CPUs the load generator may run on (its affinity)
    loadgen_nice: int | None = None  # the nice value of the thread it replays in (target=http: + target.client_nice)
    engine_cpus: list[int] | None = None  # the engine process's affinity; None: external, or the server is gone
    engine_nice: int | None = None  # the nice value of its main thread; None as for engine_cpus


@dataclass
class ServerSummary:
    server_metrics: str | None = None  # the engine whose series were read: vllm, sglang, stallfree
    server_metrics_reason: str | None = None  # why there are none
    server_metrics_scrapes: int | None = None
    server_peak_running: float | None = None
    server_peak_waiting: float | None = None
    server_peak_kv_cache_usage: float | None = None
    server_preemptions: float | None = None
    server_prefix_cache_hit_rate: float | None = None
    server_peak_prefix_cache_blocks: float | None = None
    server_prefix_cache_evictions: float | None = None
    server_queue_growing: bool | None = None
    prefix_cache_reset: str | None = None  # reset, else "not reset: <why>"
    workload_ideal_hit_rate: float | None = None  # what an unbounded prefix cache would serve of the prompts


@dataclass
class KvTransfers:
    """A disaggregated deployment's KV transfers (requests.parquet ``kv_transfer_*``); all None without them."""

    kv_transfers: int | None = None  # measured requests whose prompt's KV was sent between instances
    median_kv_transfer_bytes: float | None = None
    median_kv_transfer_ms: float | None = None  # from the first byte received to the last
    p99_kv_transfer_ms: float | None = None
