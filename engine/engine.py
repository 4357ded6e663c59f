"""LLMEngine: requests in, one scheduled iteration per ``step()``, outputs and BatchRecords out."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING

from stallfree.engine.batch_recorder import BatchRecorder
from stallfree.engine.config import EngineConfig
from stallfree.engine.device import choose_dtype, resolve_device
from stallfree.engine.executor import make_executor
from stallfree.engine.kv_cache import KVCacheManager
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.engine.outputs import RequestOutput, request_output
from stallfree.engine.prefix_cache import PrefixCachingKVCacheManager
from stallfree.engine.records import BatchRecord
from stallfree.engine.request import Request, RequestStatus, SamplingParams
from stallfree.engine.request_intake import checked_request
from stallfree.engine.runner.base import BatchRunner, FinishedBatch, RunnerDead
from stallfree.engine.runner.clock import Clock
from stallfree.engine.scheduler import make_scheduler
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.fitting.cost_model import CostModel
from stallfree.engine.simulator.fitting.profile import resolve_cost_model
from stallfree.engine.tokenizer import load_tokenizer
from stallfree.engine.utilization import make_meter

if TYPE_CHECKING:
    from stallfree.engine.distributed.remote_prefill import RemotePrefill

DEFAULT_MAX_MODEL_LEN = 4096
IDLE_POLL_S = 0.005  # how long a step with nothing to run waits for a prefilled prompt before it returns
MAX_ERROR_CHARS = 500  # of the exception message a failed request reports
logger = logging.getLogger("stallfree.engine")


class LLMEngine:
    """Not thread-safe: drive it from one thread (the server runs it on its own engine thread)."""

    def __init__(self, config: EngineConfig, cost_model: CostModel | None = None):
        """``cost_model``: a simulated runner's (``from_config`` resolves it, profiling if need be)."""
        mc, cc = config.model, config.cache
        self.simulation = None
        if mc.deployment is not None:  # a simulated GPU deployment: a model shape, no checkpoint
            from stallfree.engine.simulator.build import bounded_by_deployment, build_simulation

            self.simulation = build_simulation(config)
            config, path, arch = bounded_by_deployment(config, self.simulation), None, self.simulation.arch
        else:
            path = resolve_model_path(mc.model)
            arch = ArchConfig.from_dir(path)
        self.config = config
        self.model_name = mc.model
        self.max_model_len = min(mc.max_model_len or DEFAULT_MAX_MODEL_LEN, arch.max_position_embeddings,
                                 arch.sliding_window or arch.max_position_embeddings)
        self.device = resolve_device(mc.device)
        self.dtype_choice = choose_dtype(mc.dtype, self.device)
        self.dtype = self.dtype_choice.dtype
        logger.info("dtype: %s", self.dtype_choice)
        self.tokenizer, self.no_tokenizer_reason = (
            load_tokenizer(path, mc.tokenizer, mc.skip_tokenizer_init) if path is not None
            else (None, "a simulated deployment has no tokenizer: send token ids"))
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids = set(arch.eos_token_ids) or ({tokenizer_eos} if tokenizer_eos is not None else set())
        self.vocab_size = arch.vocab_size
        pd = None  # engine/distributed/remote_prefill.py, for a disaggregated deployment
        if config.parallel.disaggregation is not None:  # before the model loads: a bad deployment fails fast
            from stallfree.engine.distributed import remote_prefill as pd

            pd.prepare_decode_instance(config, self.device)
        self.batches: BatchRunner
        self.clock: Clock
        self.runner, self.batches, self.clock, num_blocks = make_executor(
            config, path, arch, self.max_model_len, self.dtype, self.device, self.eos_token_ids, cost_model,
            self.simulation)
        # which kernels run the linears, where a model runs in this process (not in workers or a simulation)
        self.linear_kernels: str | None = getattr(self.runner, "linear_kernels", None)
        kv_manager = PrefixCachingKVCacheManager if cc.enable_prefix_caching else KVCacheManager
        self.kv = kv_manager(num_blocks, cc.block_size, cc.watermark)
        self.scheduler = make_scheduler(config.scheduler, self.kv, self.max_model_len, self.eos_token_ids)
        self.scheduler.snapshot_block_tables = self.batches.reads_block_tables
        self.utilization = make_meter(mc.runner, self.batches, arch, self.device, self.dtype, self.dtype_choice.weight_dtype)
        self.batch_records: list[BatchRecord] = []
        self.recorder = BatchRecorder(self.kv, self.utilization)
        self.remote_prefill: RemotePrefill | None = None  # the prefill instance of a disaggregated deployment
        if pd is not None:
            self.remote_prefill = pd.RemotePrefill.start(config, type(self).from_config)
            self.recorder.instance = "decode-0"
        self.dead: str | None = None  # why the runner can run no more (a worker process died)
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """The engine of ``config``, its cost model resolved first: a simulated runner without
        ``model.cost_model`` is profiled on real engines of this model (once, cached), outside any constructor.
        With ``parallel.data_parallel_size`` > 1, replicas of it behind a router, with this API."""
        if config.parallel.data_parallel_size > 1:
            from stallfree.engine.distributed.replicas import ReplicatedEngine

            return ReplicatedEngine.start(config, cls.from_config)  # type: ignore[return-value]
        return cls(config, resolve_cost_model(config, cls))

    @classmethod
    def from_kwargs(cls, **kwargs) -> LLMEngine:
        return cls.from_config(EngineConfig.from_kwargs(**kwargs))

    # -- public API --------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests not yet admitted, those still with a prefill instance included."""
        return len(self.scheduler.waiting) + (0 if self.remote_prefill is None else self.remote_prefill.num_waiting)

    @property
    def num_computing_elsewhere(self) -> int:
        """Requests other processes are computing (a prefill instance): work while this engine runs none."""
        return 0 if self.remote_prefill is None else self.remote_prefill.num_computing

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
        """The fraction of KV blocks running requests hold (cached free blocks not counted)."""
        return self.kv.num_used_blocks / self.kv.num_blocks

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (vLLM's reset_prefix_cache): the next requests compute their whole
        prompts (on a prefill instance too). How many blocks were cached here; 0 without prefix caching."""
        if self.remote_prefill is not None:
            self.remote_prefill.reset_prefix_cache()
        return self.kv.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.num_waiting > 0

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Validate and queue a request; raises ValueError naming the problem (nothing is queued then)."""
        self.check_alive()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        request = checked_request(self, prompt, params, request_id, arrival_time)
        if self.remote_prefill is not None:
            self.remote_prefill.submit(request, self.clock())
        else:
            self.scheduler.add_request(request)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """End an unfinished request; its final output (finish_reason "abort"), or None if it was not live."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            if self.remote_prefill is None or (request := self.remote_prefill.abort(request_id, self.clock())) is None:
                return None
            return self._output(request, [])
        self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED, self.clock())
        return self._output(request, [])

    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """Schedule and run iterations until one has finished (its BatchRecord appended): outputs for every request
        that got a token, or with ``finished_only`` for those that finished. One path for every runner
        (``BatchRunner``, engine/runner/base.py): a micro-batch is scheduled among the requests not in flight
        whenever the runner can take one (a pipeline keeps up to PP in flight, any other runner one, back when
        ``submit`` returns); with nothing to schedule, wait for the oldest to leave, else for the next arrival.
        A runner that dies (RunnerDead) ends every unfinished request with its cause."""
        self.check_alive()
        outputs: list[RequestOutput] = []
        try:
            self._run_until_finished(finished_only, outputs)
        except RunnerDead as exc:
            outputs += self._die(exc)
        return outputs

    def _run_until_finished(self, finished_only: bool, outputs: list[RequestOutput]) -> None:
        batches, remote = self.batches, self.remote_prefill
        while True:
            if remote is not None:
                outputs += self._take_prefilled(0.0)
            now = self.clock()
            if self._apply(batches.pop_finished(now), finished_only, outputs):
                return
            if not batches.full:
                scheduler_output = self.scheduler.schedule(now)
                if remote is not None:
                    remote.release_admitted(self.kv, self.scheduler.requests)
                if scheduler_output.units:
                    batches.submit(scheduler_output, now)
                    if self._apply(batches.pop_finished(self.clock()), finished_only, outputs):
                        return
                    continue  # a pipeline with room: the next micro-batch
            if batches.wait():
                continue
            if remote is not None and remote.num_waiting and not self.scheduler.has_unfinished():
                outputs += self._take_prefilled(IDLE_POLL_S)  # idle until a prefilled prompt arrives
                if self.scheduler.has_unfinished():
                    continue
            arrival = self.scheduler.next_arrival_time()
            if arrival is not None:
                self.clock.idle_until(arrival)
            batches.idle_until(now if arrival is None else arrival)
            return

    def _apply(self, finished: list[FinishedBatch], finished_only: bool, outputs: list[RequestOutput]) -> int:
        """Apply finished micro-batches to their requests and record them, their requests' outputs appended to
        ``outputs``; how many there were."""
        for batch in finished:
            scheduler_output, result, failed = batch.output, batch.result, []
            if batch.errors:
                scheduler_output, failed = self._fail_requests(scheduler_output, batch.errors)
            for request_id, logprobs in result.prompt_logprobs.items():  # before a finishing request leaves
                if (request := self.scheduler.requests.get(request_id)) is not None:  # None: aborted meanwhile
                    request.prompt_logprobs += logprobs
            updated = self.scheduler.update_from_output(scheduler_output, result.sampled_token_ids, batch.end_s)
            for request in updated:
                if request.logprobs is not None:
                    request.logprobs.append(result.sample_logprobs[request.request_id])
            self.batch_records.append(self.recorder.record(scheduler_output, batch.start_s, batch.end_s, result,
                                                           len(self.scheduler.waiting), self.num_running))
            outputs += self._outputs(updated, finished_only) + failed
        return len(finished)

    def _take_prefilled(self, timeout_s: float) -> list[RequestOutput]:
        """Hand the requests whose prompts' KV came back from the prefill instance to the scheduler; the outputs
        of those it failed on."""
        remote = self.remote_prefill
        failed = remote.deliver(self.kv, self.runner, self.scheduler.add_request, self.clock, timeout_s)
        self.batch_records += remote.batch_records  # the prefill instance's, in the order they came
        remote.batch_records = []
        return [self._output(request, [], error=error) for request, error in failed]

    def check_alive(self) -> None:
        """Raise RunnerDead once the runner can run no more (its cause in the message)."""
        if self.dead is not None:
            raise RunnerDead(self.dead)

    def shutdown(self) -> None:
        """Stop the runner's worker processes and the prefill instance, if it has any (again: a no-op)."""
        self.batches.shutdown()
        if self.remote_prefill is not None:
            self.remote_prefill.shutdown()

    def _die(self, exc: RunnerDead) -> list[RequestOutput]:
        """End every unfinished request with ``exc`` as its error; later calls raise it."""
        self.dead = f"the engine stopped: {exc}"[:MAX_ERROR_CHARS]
        now, requests = self.clock(), list(self.scheduler.requests.values())
        for request in requests:
            self.scheduler.finish(request, RequestStatus.FINISHED_ERROR, now)
        if self.remote_prefill is not None:
            requests += self.remote_prefill.end_all(now)
        return [self._output(request, [], error=self.dead) for request in requests]

    def reconfigure_scheduler(self, **knobs) -> None:
        """Replace the scheduler, while no request is unfinished, with one built from the scheduler config
        with ``knobs`` changed (``policy``, ``chunk_size``, ``max_num_batched_tokens``, ...): studies that shape
        iterations switch policies and token budgets on one loaded model (loadgen/studies)."""
        if self.has_unfinished():
            raise RuntimeError("reconfigure_scheduler needs an engine with no unfinished request")
        knobs = {("policy" if key == "scheduler" else key): value for key, value in knobs.items()}
        self.config = dataclasses.replace(self.config, scheduler=dataclasses.replace(self.config.scheduler, **knobs))
        finished = self.scheduler.finished_request_ids  # not yet handed to the runner
        self.scheduler = make_scheduler(self.config.scheduler, self.kv, self.max_model_len, self.eos_token_ids)
        self.scheduler.finished_request_ids = finished

    def pop_batch_records(self) -> list[BatchRecord]:
        """The BatchRecords since the last call, handed over (a long-running server must not keep them all)."""
        records, self.batch_records = self.batch_records, []
        return records

    # -- internals ---------------------------------------------------------------------------------

    def _fail_requests(self, output: SchedulerOutput,
                       errors: dict[str, Exception]) -> tuple[SchedulerOutput, list[RequestOutput]]:
        """End the requests a step failed on (status "error", blocks freed); the step without them."""
        now, failed = self.clock(), []
        for request_id, exc in errors.items():
            error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            logger.warning("request %s ended: its step fails on it alone: %s", request_id, error)
            request = self.scheduler.requests[request_id]
            self.scheduler.finish(request, RequestStatus.FINISHED_ERROR, now)
            failed.append(self._output(request, [], error=error))
        return dataclasses.replace(output, units=[u for u in output.units if u.request_id not in errors]), failed

    def _outputs(self, updated: list[Request], finished_only: bool) -> list[RequestOutput]:
        if finished_only:  # a finished request has its finish time
            updated = [request for request in updated if request.metrics.finish_time is not None]
        return [self._output(request, request.output_token_ids[-1:]) for request in updated]

    def _output(self, request: Request, new_tokens: list[int], error: str | None = None) -> RequestOutput:
        return request_output(request, new_tokens, self.tokenizer, error)
