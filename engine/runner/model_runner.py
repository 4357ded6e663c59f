"""ModelRunner: a ``SchedulerOutput`` -> flat tensors -> one forward pass -> sampled tokens."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import torch

from stallfree.engine.model.llama import Hidden, LlamaForCausalLM
from stallfree.engine.model.loader import linear_kernels
from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.batch_prep import HostBatch, prepare_host_batch, to_device
from stallfree.engine.runner.cpu_threads import CpuThreads
from stallfree.engine.runner.cuda_graphs import DecodeGraphs, Graph, cuda_graph_factory
from stallfree.engine.runner.kv_sizing import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GIB,
    Baseline,
    MemoryProbe,
    MemoryProfile,
    kv_cache_bytes,
    measure,
)
from stallfree.engine.runner.logprobs import PromptRows, prompt_rows, split_prompt_logprobs, token_logprobs
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.runner.sampler import sample
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput
from stallfree.engine.utilization import SplitSampler

log = logging.getLogger(__name__)
WARM_UP_PARAMS = SamplingParams(max_tokens=1, temperature=0.0)


class ModelRunner:
    reads_block_tables = True
    computes_logits = True

    """``cuda_graphs``: replay decode-only steps from CUDA graphs (CUDA with a graph-safe attention backend
    only; ``max_num_seqs`` sizes the largest one; ``new_graph`` replaces CUDA graphs, for tests on CPU).
    ``op_split_every``: time the linear layers and attention of every Nth iteration (its output's
    ``operator_split``; 0: never). ``cpu_threads``: set the thread count before each iteration to the cores other
    processes leave free.

    ``num_blocks=None``: size the KV cache from measured device memory (``engine/runner/kv_sizing.py``), with
    ``memory`` = the probe and its baseline taken before the weights were loaded, after a warm-up pass of
    ``max_num_batched_tokens`` tokens."""

    def __init__(self, model: LlamaForCausalLM, attn_backend, num_blocks: int | None, block_size: int,
                 dtype: torch.dtype, device: torch.device, seed: int, *, cuda_graphs: bool, max_num_seqs: int,
                 max_model_len: int, max_num_batched_tokens: int = 0, gpu_memory_utilization: float | None = None,
                 memory: tuple[MemoryProbe, Baseline] | None = None, new_graph: Callable[[], Graph] | None = None,
                 op_split_every: int = 0, cpu_threads: CpuThreads | None = None):
        self.model, self.attn_backend, self.block_size, self.device = model, attn_backend, block_size, device
        self.dtype, self.max_model_len = dtype, max_model_len
        self.linear_kernels = linear_kernels(model)
        log.info("linear kernels: %s", self.linear_kernels)
        graph_safe = getattr(attn_backend, "cuda_graph_safe", False)
        use_graphs = cuda_graphs and graph_safe and (device.type == "cuda" or new_graph is not None)
        if cuda_graphs and device.type == "cuda" and not graph_safe:
            log.warning("CUDA graphs are off: the %s attention backend is not graph-safe (use "
                        "attention_backend=triton); every decode step runs eagerly", type(attn_backend).__name__)
        self.memory_profile: MemoryProfile | None = None
        if num_blocks is None:
            if memory is None:
                raise ValueError("num_blocks=None needs a memory probe (the KV cache is sized from device memory)")
            num_blocks = self._blocks_from_memory(*memory, max_num_batched_tokens, max_num_seqs if use_graphs else 0,
                                                  gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION)
        self.num_blocks = num_blocks
        # Graph padding rows write into one extra block that no request owns.
        self.kv_caches = self._new_kv_caches(num_blocks + use_graphs)
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}  # requests with their own sampling seed
        self.decode_graphs = None
        self.split_sampler = SplitSampler(model, device, op_split_every)
        self.cpu_threads = cpu_threads
        if use_graphs:
            self.decode_graphs = DecodeGraphs(model, attn_backend, self.kv_caches, max_num_seqs=max_num_seqs,
                                              max_blocks_per_seq=-(-max_model_len // block_size),
                                              scratch_block=num_blocks, block_size=block_size, device=device,
                                              new_graph=new_graph or cuda_graph_factory())
            self.decode_graphs.capture_all()

    def shutdown(self) -> None:
        pass  # one process: nothing to stop (a distributed runner stops its workers)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput, hidden: Hidden | None = None) -> ModelRunnerOutput:
        """Run one iteration; the sampled token of each unit that completes its request's tokens. The last stage
        of a pipeline runs it on the previous stage's ``hidden`` states."""
        for request_id in scheduler_output.finished_request_ids:
            self.generators.pop(request_id, None)
        units = scheduler_output.units  # decodes first
        threads = 0
        if self.device.type == "cpu":
            threads = self.cpu_threads.update() if self.cpu_threads is not None else torch.get_num_threads()
        host, rows, num_sampling = self._host_batch(units)
        input_ids, positions, meta, logits_indices = to_device(host, self.device)
        decode_only = host.num_decodes == len(units) and rows is None
        split = None
        if decode_only and hidden is None and self.decode_graphs and \
                self.decode_graphs.fits(len(units), host.block_tables.shape[1]):
            logits = self.decode_graphs.run(input_ids, positions, meta)  # a graph replay is never split
        else:
            split = self.split_sampler.next(self.attn_backend)
            backend = self.attn_backend if split is None else split.backend
            logits = self.model(input_ids, positions, backend, self.kv_caches, meta, logits_indices, hidden)
        sampling = [u for u in units if u.samples]
        sample_logits = logits if rows is None else logits[:num_sampling]
        tokens = sample(sample_logits, [u.sampling_params for u in sampling],
                        [self._generator(u.request_id, u.sampling_params) for u in sampling])
        output = ModelRunnerOutput(  # tolist: one device->host copy
            {u.request_id: t for u, t in zip(sampling, tokens.tolist(), strict=True)}, cpu_threads=threads,
            operator_split=None if split is None else split.finish())
        self._add_logprobs(output, logits, num_sampling, sampling, tokens, rows)
        return output

    @torch.inference_mode()
    def execute_forward(self, scheduler_output: SchedulerOutput, hidden: Hidden | None = None) -> Hidden | None:
        """An iteration through this rank's layers with no sampling (another rank samples, engine/distributed/):
        a tensor-parallel worker's part, which joins the driver's collectives, or a pipeline stage's, from the
        previous stage's ``hidden`` states (none on the first stage). A rank of an earlier stage returns the
        hidden states the next stage takes; one of the last stage also runs the LM head (joining the
        vocab-parallel LM head's collectives) and returns None."""
        host, _, _ = self._host_batch(scheduler_output.units)
        input_ids, positions, meta, logits_indices = to_device(host, self.device)
        if not self.model.stage.last:
            return self.model.hidden_states(input_ids, positions, self.attn_backend, self.kv_caches, meta, hidden)
        self.model(input_ids, positions, self.attn_backend, self.kv_caches, meta, logits_indices, hidden)
        return None

    def _host_batch(self, units: list[ScheduledUnit]) -> tuple[HostBatch, PromptRows | None, int]:
        """The flat batch on the host, the prompt rows whose logprobs are asked for, and how many rows sample
        (the logits of the prompt rows come after theirs)."""
        host = prepare_host_batch(units, self.block_size)
        rows = prompt_rows(units, host.query_start_loc)
        num_sampling = len(host.logits_indices)
        if rows is not None:
            host.logits_indices = np.concatenate((host.logits_indices, rows.flat_indices))
        return host, rows, num_sampling

    @staticmethod
    def _add_logprobs(output: ModelRunnerOutput, logits: torch.Tensor, num_sampling: int,
                      sampling: list[ScheduledUnit], tokens: torch.Tensor, rows: PromptRows | None) -> None:
        """The logprobs the iteration's requests ask for, into ``output``."""
        asking = [i for i, u in enumerate(sampling) if u.sampling_params.logprobs is not None]
        if asking:
            index = torch.tensor(asking, device=logits.device)
            found = token_logprobs(logits[index], tokens[index], [sampling[i].sampling_params.logprobs for i in asking])
            output.sample_logprobs = {sampling[i].request_id: lp for i, lp in zip(asking, found, strict=True)}
        if rows is not None:
            targets = torch.tensor(rows.targets, device=logits.device)
            output.prompt_logprobs = split_prompt_logprobs(rows, token_logprobs(logits[num_sampling:], targets, rows.ks))

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        if params.seed is None:
            return self.default_generator
        if request_id not in self.generators:
            self.generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return self.generators[request_id]

    # -- KV cache sizing ---------------------------------------------------------------------------

    def _new_kv_caches(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = self.attn_backend.kv_cache_shape(num_blocks, self.block_size)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.model.layers]

    def bytes_per_block(self) -> int:
        per_layer = math.prod(self.attn_backend.kv_cache_shape(1, self.block_size))
        return 2 * len(self.model.layers) * per_layer * torch.empty((), dtype=self.dtype).element_size()

    def _blocks_from_memory(self, probe: MemoryProbe, baseline: Baseline, max_num_batched_tokens: int,
                            largest_bucket: int, utilization: float) -> int:
        if max_num_batched_tokens < 1:
            raise ValueError("sizing the KV cache from device memory needs max_num_batched_tokens >= 1")
        # Prompts of at most max_model_len - 1 tokens that add up to the largest iteration.
        lengths = [min(self.max_model_len - 1, max_num_batched_tokens - start)
                   for start in range(0, max_num_batched_tokens, self.max_model_len - 1)]
        decodes = (lambda: self._warm_up([(1, 1)] * largest_bucket)) if largest_bucket else None
        profile = measure(probe, baseline, lambda: self._warm_up([(0, n) for n in lengths]), decodes)
        self.memory_profile = profile
        num_blocks = kv_cache_bytes(profile, utilization) // self.bytes_per_block()
        log.info("KV cache: %d blocks (%.1f GiB) = %.2f x %.1f GiB less weights and activations %.1f GiB, "
                 "non-torch %.1f GiB, CUDA graphs %.1f GiB", num_blocks, num_blocks * self.bytes_per_block() / GIB,
                 utilization, profile.total / GIB, profile.weights_and_activations / GIB, profile.non_torch / GIB,
                 profile.graphs / GIB)
        if num_blocks < 1:
            raise ValueError(f"gpu_memory_utilization={utilization} leaves room for no KV block; raise it")
        return num_blocks

    @torch.inference_mode()
    def _warm_up(self, sequences: list[tuple[int, int]]) -> None:
        """One forward pass (and sampling) of sequences of (cached tokens, new tokens), prefills when nothing
        is cached, on a throwaway KV cache just large enough."""
        units, next_block = [], 0
        for i, (context, new) in enumerate(sequences):
            blocks = -(-(context + new) // self.block_size)
            units.append(ScheduledUnit(f"warm-up-{i}", [0] * new, context, context == 0, True,
                                       list(range(next_block, next_block + blocks)), WARM_UP_PARAMS))
            next_block += blocks
        kv_caches = self._new_kv_caches(next_block)
        input_ids, positions, meta, logits_indices = to_device(prepare_host_batch(units, self.block_size),
                                                               self.device)
        logits = self.model(input_ids, positions, self.attn_backend, kv_caches, meta, logits_indices)
        sample(logits, [WARM_UP_PARAMS] * len(units), [None] * len(units))
