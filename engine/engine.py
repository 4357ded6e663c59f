"""LLMEngine: requests in, one scheduled iteration per ``step()``, outputs and BatchRecords out."""
from __future__ import annotations

import itertools
import time

import torch

from engine.attention import make_attention_backend
from engine.config import EngineConfig
from engine.device import resolve_device, resolve_dtype
from engine.kv_cache import KVCacheManager, blocks_for
from engine.model.arch import ArchConfig
from engine.model.loader import load_model
from engine.model.presets import resolve_model_path
from engine.outputs import BatchRecord, RequestOutput
from engine.request import Request, RequestStatus, SamplingParams
from engine.runner import ModelRunner
from engine.scheduler import make_scheduler
from engine.simulator import CostModel, SimulatedRunner, VirtualClock, profile_cost_model

DEFAULT_MAX_MODEL_LEN = 4096


class LLMEngine:
    """Not thread-safe: drive it from one thread (the server runs it on its own engine thread)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        mc, cc = config.model, config.cache
        self.model_name = mc.model
        path = resolve_model_path(mc.model)
        arch = ArchConfig.from_dir(path)
        self.max_model_len = min(mc.max_model_len or DEFAULT_MAX_MODEL_LEN, arch.max_position_embeddings,
                                 arch.sliding_window or arch.max_position_embeddings)
        self.device = resolve_device(mc.device)
        self.dtype = resolve_dtype(mc.dtype, self.device)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.eos_token_ids = set(arch.eos_token_ids) or {self.tokenizer.eos_token_id}
        self.vocab_size = arch.vocab_size
        num_blocks = cc.num_blocks or self._num_blocks_for_budget(arch)
        self.kv = KVCacheManager(num_blocks, cc.block_size, cc.watermark)
        self.scheduler = make_scheduler(config.scheduler, self.kv, self.max_model_len)
        if mc.runner == "model":
            model = load_model(path, arch, self.max_model_len, self.dtype, self.device)
            attn = make_attention_backend(mc.attention_backend, self.device, self.dtype, num_heads=arch.num_heads,
                                          num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                                          scale=arch.head_dim ** -0.5)
            self.runner = ModelRunner(model, attn, self.kv, num_blocks, self.dtype, self.device, mc.seed)
        elif mc.runner == "simulated":
            if mc.clock not in ("real", "virtual"):
                raise ValueError(f"unknown model.clock {mc.clock!r}; choose real or virtual")
            cost_model = CostModel.load(mc.cost_model) if mc.cost_model else profile_cost_model(config)
            virtual = VirtualClock() if mc.clock == "virtual" else None
            if virtual is not None:
                self.clock = virtual  # every timestamp the engine takes is simulated time
            self.runner = SimulatedRunner(cost_model, self.kv, arch.vocab_size, self.eos_token_ids, virtual,
                                          mc.seed)
        else:
            raise ValueError(f"unknown model.runner {mc.runner!r}; choose model or simulated")
        self.requests: dict[str, Request] = {}
        self.batch_records: list[BatchRecord] = []
        self._ids = itertools.count()
        self._iterations = itertools.count()  # kept apart from batch_records, which a server may trim

    @classmethod
    def from_kwargs(cls, **kwargs) -> LLMEngine:
        return cls(EngineConfig.from_kwargs(**kwargs))

    def _num_blocks_for_budget(self, arch: ArchConfig) -> int:
        cc = self.config.cache
        bytes_per_block = (2 * arch.num_layers * cc.block_size * arch.num_kv_heads * arch.head_dim
                           * torch.empty((), dtype=self.dtype).element_size())
        budget = cc.kv_memory_gib * 2**30
        if self.device.type == "cuda" and cc.gpu_memory_utilization:
            budget = torch.cuda.mem_get_info(self.device)[0] * cc.gpu_memory_utilization
        return max(1, int(budget // bytes_per_block))

    @staticmethod
    def clock() -> float:
        return time.time()

    # -- public API --------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_free_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.kv.num_blocks

    def kv_usage(self) -> float:
        return self.kv.num_used_blocks / self.kv.num_blocks

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Validate and queue a request; raises ValueError naming the problem (nothing is queued then)."""
        params = params or SamplingParams()
        params.validate()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not token_ids:
            raise ValueError("prompt is empty")
        vocab = self.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len} "
                             "(prompt plus at least one generated token must fit)")
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"duplicate request_id {request_id!r}")
        request = Request(request_id, token_ids, params,
                          self.clock() if arrival_time is None else arrival_time, self.max_model_len)
        needed = blocks_for(request.max_num_tokens, self.kv.block_size)
        if needed > self.kv.num_blocks - self.kv.watermark_blocks:
            raise ValueError(f"request needs {needed} KV blocks but the cache has {self.kv.num_blocks}; "
                             "raise cache.kv_memory_gib or lower max_tokens")
        self.requests[request_id] = request
        self.scheduler.add_request(request)
        return request_id

    def abort(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._finish(request, RequestStatus.FINISHED_ABORTED, self.clock())
        return True

    def step(self) -> list[RequestOutput]:
        start = self.clock()
        batch = self.scheduler.schedule(start)
        if not batch.units:
            if isinstance(self.clock, VirtualClock) and self.scheduler.waiting:
                self.clock.advance_to(self.scheduler.waiting[0].metrics.arrival_time)  # idle until it arrives
            return []
        for unit in batch.units:
            if unit.request.metrics.first_scheduled_time is None:
                unit.request.metrics.first_scheduled_time = start
        sampled = self.runner.execute(batch)
        end = self.clock()
        outputs = []
        for unit in batch.units:
            request = unit.request
            request.num_computed_tokens += unit.num_new_tokens
            token = sampled.get(request.request_id)
            if token is None:
                continue
            request.output_token_ids.append(token)
            request.metrics.token_times.append(end)
            if request.metrics.first_token_time is None:
                request.metrics.first_token_time = end
            status = self._stop_status(request, token)
            if status is not None:
                self._finish(request, status, end)
            outputs.append(self._output(request, [token]))
        self.batch_records.append(BatchRecord(
            iteration=next(self._iterations), start_time=start, end_time=end,
            num_prefill_tokens=batch.num_prefill_tokens, num_decode_tokens=batch.num_decode_tokens,
            num_prefill_seqs=batch.num_prefill_seqs, num_decode_seqs=batch.num_decode_seqs,
            num_preemptions=len(batch.preempted), num_kv_blocks_used=self.kv.num_used_blocks,
            num_waiting=self.num_waiting, num_running=self.num_running))
        return outputs

    # -- internals ---------------------------------------------------------------------------------

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        p = request.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return RequestStatus.FINISHED_STOPPED
        if request.num_tokens >= request.max_num_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus, now: float) -> None:
        request.status = status
        request.metrics.finish_time = now
        self.scheduler.remove(request)
        self.runner.release(request.request_id)
        del self.requests[request.request_id]

    def _output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        finished = request.status.finished
        return RequestOutput(
            request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
            token_ids=list(request.output_token_ids), new_token_ids=new_tokens,
            # Decoding the whole output every step is quadratic: only finished outputs carry text.
            text=self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True) if finished else "",
            finished=finished, finish_reason=request.status.value if finished else None,
            metrics=request.metrics)
