"""ModelRunner: a ``SchedulerOutput`` -> flat tensors -> one forward pass -> sampled tokens."""
from __future__ import annotations

import torch

from engine.model.llama import LlamaForCausalLM
from engine.request import SamplingParams
from engine.runner.batch_prep import prepare_host_batch, to_device
from engine.runner.cuda_graphs import DecodeGraphs
from engine.runner.sampler import sample
from engine.scheduler.output import SchedulerOutput
from engine.utilization import OperatorSplit, SplitSampler


class ModelRunner:
    """``cuda_graphs``: replay decode-only steps from CUDA graphs (CUDA with a graph-safe attention backend
    only; ``max_num_seqs`` sizes the largest one). ``op_split_every``: time the linear layers and attention
    of every Nth iteration (``last_operator_split``; 0: never)."""

    def __init__(self, model: LlamaForCausalLM, attn_backend, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, seed: int, *, cuda_graphs: bool, max_num_seqs: int,
                 max_model_len: int, op_split_every: int = 0):
        self.model, self.attn_backend, self.block_size, self.device = model, attn_backend, block_size, device
        use_graphs = cuda_graphs and device.type == "cuda" and getattr(attn_backend, "cuda_graph_safe", False)
        # Graph padding rows write into one extra block that no request owns.
        shape = attn_backend.kv_cache_shape(num_blocks + use_graphs, block_size)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(model.cfg.num_layers)]
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}  # requests with their own sampling seed
        self.decode_graphs = None
        self.split_sampler = SplitSampler(model, device, op_split_every)
        self.last_operator_split: OperatorSplit | None = None  # of the last iteration, when it was sampled
        if use_graphs:
            self.decode_graphs = DecodeGraphs(model, attn_backend, self.kv_caches, max_num_seqs=max_num_seqs,
                                              max_blocks_per_seq=-(-max_model_len // block_size),
                                              scratch_block=num_blocks, block_size=block_size, device=device)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        """Run one iteration; return the sampled token for each unit that completes its request's tokens."""
        for request_id in scheduler_output.finished_request_ids:
            self.generators.pop(request_id, None)
        units = scheduler_output.units  # decodes first
        host = prepare_host_batch(units, self.block_size)
        input_ids, positions, meta, logits_indices = to_device(host, self.device)
        decode_only = host.num_decodes == len(units)
        split = None
        if decode_only and self.decode_graphs and self.decode_graphs.fits(len(units), host.block_tables.shape[1]):
            logits = self.decode_graphs.run(input_ids, positions, meta)  # a graph replay is never split
        else:
            split = self.split_sampler.next(self.attn_backend)
            backend = self.attn_backend if split is None else split.backend
            logits = self.model(input_ids, positions, backend, self.kv_caches, meta, logits_indices)
        sampling = [u for u in units if u.samples]
        tokens = sample(logits, [u.sampling_params for u in sampling],
                        [self._generator(u.request_id, u.sampling_params) for u in sampling])
        self.last_operator_split = None if split is None else split.finish()
        return {u.request_id: t for u, t in zip(sampling, tokens.tolist(), strict=True)}  # one device->host copy

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        if params.seed is None:
            return self.default_generator
        if request_id not in self.generators:
            self.generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return self.generators[request_id]
