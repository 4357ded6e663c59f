"""Prometheus metrics of one server (its own CollectorRegistry), with vLLM's metric names (and buckets).
The HTTP series (``http_requests_total``, ``http_request_duration_seconds``, ...) are added to the same
registry by prometheus-fastapi-instrumentator (engine/server/app.py:build_app), as in vLLM's server."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from stallfree.engine import BatchRecord, RequestOutput

FINISH_REASONS = ("stop", "length", "abort", "error")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
UTILISATION_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's buckets for per-request token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


class ServerMetrics:
    """Engine-side series are updated by the engine thread, HTTP series by the event loop
    (prometheus_client is thread-safe)."""

    def __init__(self, model_name: str, max_model_len: int):
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def child(metric):
            return metric.labels(model_name=model_name)

        self.num_running = child(Gauge("vllm:num_requests_running", "Requests in the running batch.",
                                       labels, registry=r))
        self.num_waiting = child(Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                                       labels, registry=r))
        self.kv_usage = child(Gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).",
                                    labels, registry=r))
        success = Counter("vllm:request_success", "Finished requests by finish reason.",
                          labels + ["finished_reason"], registry=r)
        self.finished = {reason: success.labels(model_name=model_name, finished_reason=reason)
                         for reason in FINISH_REASONS}
        self.prompt_tokens = child(Counter("vllm:prompt_tokens", "Prompt tokens of requests that got their "
                                           "first token.", labels, registry=r))
        self.generation_tokens = child(Counter("vllm:generation_tokens", "Generated tokens.", labels, registry=r))
        self.preemptions = child(Counter("vllm:num_preemptions", "Preemptions (by recompute).", labels,
                                         registry=r))
        # vLLM's prefix-cache counters (tokens of admitted requests looked up / found), stallfree's cache size
        self.prefix_cache_queries = child(Counter("vllm:prefix_cache_queries", "Prefix cache queries, in "
                                                  "tokens (the prompts of admitted requests).", labels, registry=r))
        self.prefix_cache_hits = child(Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens (taken "
                                               "from the cache, not computed).", labels, registry=r))
        self.prefix_cache_blocks = child(Gauge("stallfree:prefix_cache_blocks", "Free KV blocks holding a cached "
                                               "prefix (evictable).", labels, registry=r))
        self.prefix_cache_evictions = child(Counter("stallfree:prefix_cache_evictions", "Cached KV blocks "
                                                    "evicted for other tokens.", labels, registry=r))
        self.ttft = child(Histogram("vllm:time_to_first_token_seconds", "Time to first token (server side).",
                                    labels, buckets=TTFT_BUCKETS, registry=r))
        self.tbt = child(Histogram("vllm:inter_token_latency_seconds", "Time between consecutive output "
                                   "tokens (TBT).", labels, buckets=TBT_BUCKETS, registry=r))
        self.e2e = child(Histogram("vllm:e2e_request_latency_seconds", "Arrival to finish of requests that "
                                   "finished with stop or length.", labels, buckets=E2E_BUCKETS, registry=r))
        self.queue_time = child(Histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.",
                                          labels, buckets=E2E_BUCKETS, registry=r))
        self.prefill_time = child(Histogram("vllm:request_prefill_time_seconds", "First scheduled to first "
                                            "token (PREFILL phase) of finished requests.", labels,
                                            buckets=E2E_BUCKETS, registry=r))
        self.decode_time = child(Histogram("vllm:request_decode_time_seconds", "First to last token (DECODE "
                                           "phase) of finished requests.", labels, buckets=E2E_BUCKETS, registry=r))
        self.inference_time = child(Histogram("vllm:request_inference_time_seconds", "First scheduled to last "
                                              "token (RUNNING phase) of finished requests.", labels,
                                              buckets=E2E_BUCKETS, registry=r))
        self.request_prompt_tokens = child(Histogram("vllm:request_prompt_tokens", "Prompt tokens of finished "
                                                     "requests.", labels, buckets=buckets_1_2_5(max_model_len),
                                                     registry=r))
        self.request_generation_tokens = child(Histogram("vllm:request_generation_tokens", "Generated tokens "
                                                         "of finished requests.", labels,
                                                         buckets=buckets_1_2_5(max_model_len), registry=r))
        self.iteration_tokens = child(Histogram("vllm:iteration_tokens_total", "Tokens (prefill + decode) "
                                                "computed per engine iteration.", labels,
                                                buckets=ITERATION_TOKENS_BUCKETS, registry=r))
        self.iterations = child(Counter("stallfree:iterations", "Engine iterations.", labels, registry=r))
        self.iteration_prefill_tokens = child(Counter(
            "stallfree:iteration_prefill_tokens", "Prefill tokens computed by engine iterations (recomputes "
            "after preemption included).", labels, registry=r))
        self.iteration_decode_tokens = child(Counter(
            "stallfree:iteration_decode_tokens", "Decode tokens computed by engine iterations.", labels,
            registry=r))
        # Per-iteration utilisation (engine/utilization; BatchRecord.mfu / .mbu): the mean over a window is
        # the increase of _sum over the increase of _count (the Locust LLM tab reads them so).
        self.iteration_mfu = child(Histogram(
            "stallfree:iteration_mfu", "Model FLOPs utilisation of each engine iteration (0-1).", labels,
            buckets=UTILISATION_BUCKETS, registry=r))
        self.iteration_mbu = child(Histogram(
            "stallfree:iteration_mbu", "Model bandwidth utilisation of each engine iteration (0-1).", labels,
            buckets=UTILISATION_BUCKETS, registry=r))
        self.engine_errors = child(Counter("stallfree:engine_step_errors", "Exceptions raised by engine.step.",
                                           labels, registry=r))
        self.batch_history_records = child(Gauge(
            "stallfree:batch_history_records", "BatchRecords kept for GET /stallfree/batches.", labels, registry=r))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- engine thread -----------------------------------------------------------------------------

    def set_state(self, num_running: int, num_waiting: int, kv_usage: float) -> None:
        self.num_running.set(num_running)
        self.num_waiting.set(num_waiting)
        self.kv_usage.set(kv_usage)

    def observe_iteration(self, record: BatchRecord) -> None:
        self.iterations.inc()
        self.iteration_tokens.observe(record.num_prefill_tokens + record.num_decode_tokens)
        self.iteration_prefill_tokens.inc(record.num_prefill_tokens)
        self.iteration_decode_tokens.inc(record.num_decode_tokens)
        self.preemptions.inc(record.num_preemptions)
        self.prefix_cache_queries.inc(record.prefix_cache_queried_tokens)
        self.prefix_cache_hits.inc(record.num_cached_tokens)
        self.prefix_cache_evictions.inc(record.num_kv_blocks_evicted)
        self.prefix_cache_blocks.set(record.num_kv_blocks_cached)
        if record.mfu is not None:
            self.iteration_mfu.observe(record.mfu)
            self.iteration_mbu.observe(record.mbu)

    def observe_output(self, out: RequestOutput) -> None:
        """One step's output of a request (one new token)."""
        m = out.metrics
        self.generation_tokens.inc(len(out.new_token_ids))
        if len(out.token_ids) == len(out.new_token_ids):  # the first token(s)
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            self.ttft.observe(m.first_token_time - m.arrival_time)
            self.queue_time.observe(m.first_scheduled_time - m.arrival_time)
        elif len(m.token_times) >= 2:
            self.tbt.observe(m.token_times[-1] - m.token_times[-2])
        if out.finished:
            self.observe_finished(out, out.finish_reason)

    def observe_finished(self, out: RequestOutput, reason: str) -> None:
        """A request's end: its finish reason, and (unless aborted or failed) the per-request histograms."""
        self.finished[reason].inc()
        m = out.metrics
        if reason in ("abort", "error") or m.finish_time is None:
            return
        self.e2e.observe(m.finish_time - m.arrival_time)
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        self.request_generation_tokens.observe(len(out.token_ids))
        if m.first_token_time is not None and m.first_scheduled_time is not None:
            self.prefill_time.observe(m.first_token_time - m.first_scheduled_time)
            self.decode_time.observe(m.token_times[-1] - m.first_token_time)
            self.inference_time.observe(m.token_times[-1] - m.first_scheduled_time)
