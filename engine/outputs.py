"""What the engine reports: per-request outputs and one BatchRecord per iteration."""
from __future__ import annotations

from dataclasses import dataclass, field

from stallfree.engine.request import RequestMetrics, TokenLogprob


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    new_token_ids: list[int]  # the tokens emitted by this step
    text: str  # the decoded output, filled when the request finishes (streamers decode new_token_ids)
    finished: bool
    finish_reason: str | None  # stop | length | abort | error
    metrics: RequestMetrics  # the request's timings so far
    error: str | None = None  # finish_reason "error": what its step raised (the other requests carried on)
    logprobs: list[TokenLogprob] | None = None  # one per entry of token_ids (SamplingParams.logprobs set)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token, the first None


@dataclass
class BatchRecord:
    iteration: int  # 0, 1, ... in the order the engine ran them
    start_time: float  # on the engine's clock, when the step began scheduling
    end_time: float  # when the runner returned (forward pass and sampling done)
    num_prefill_tokens: int  # prompt tokens computed (all prefill chunks)
    num_decode_tokens: int  # decode tokens computed (one per decoding request)
    num_prefill_seqs: int  # requests with a prefill chunk in the iteration
    num_decode_seqs: int  # requests decoding in the iteration
    prefill_attention_work: int  # sum over prefill chunks of chunk tokens x (cached context + chunk tokens)
    decode_context_tokens: int  # sum over decodes of their context length
    num_preemptions: int  # requests preempted (by recompute) while building the iteration
    num_kv_blocks_used: int  # KV blocks held after the step (finished requests freed theirs)
    num_waiting: int  # requests waiting after the step
    num_running: int  # requests running after the step
    # A pipeline's stages, simulated (engine/simulator/pipeline.py) or real (engine/distributed/); else empty.
    stage_busy_s: list[float] = field(default_factory=list)  # each stage's busy time on this micro-batch
    stage_idle_s: list[float] = field(default_factory=list)  # each stage's idle time (bubble) right before it
    # the part of each stage's idle time spent taking the micro-batch once it was sent and the stage free
    stage_handoff_s: list[float] = field(default_factory=list)
    cpu_threads: int = 0  # CPU threads the iteration ran with (engine/runner/cpu_threads.py); 0: not on the CPU
    # Prefix caching (engine/prefix_cache.py; all 0 without it), counted since the previous record:
    prefix_cache_queried_tokens: int = 0  # tokens of the requests admitted, looked up in the cache
    num_cached_tokens: int = 0  # of those, tokens taken from the cache (not computed)
    num_kv_blocks_evicted: int = 0  # cached blocks handed out for other tokens
    num_kv_blocks_cached: int = 0  # free blocks holding a cached prefix after the step (not in num_kv_blocks_used)
    # Utilisation (engine/utilization): counted from the shapes, against this machine's limits.
    model_flops: float = 0.0  # the iteration's model FLOPs (linear layers and attention)
    bytes_moved: float = 0.0  # weights read, KV read and written
    mfu: float | None = None  # model FLOPs / (time x peak FLOP/s); None when the limits are unknown
    mbu: float | None = None  # bytes moved / (time x memory bandwidth); None when the limits are unknown
    linear_s: float | None = None  # the operator split of a sampled iteration (model.op_split_every); else None
    attention_s: float | None = None
    other_s: float | None = None
