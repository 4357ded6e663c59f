"""ModelRunner: a ``SchedulerOutput`` -> flat tensors -> one forward pass -> sampled tokens."""
from __future__ import annotations

import itertools

import torch

from engine.attention import AttentionMetadata, PrefillSeq
from engine.model.llama import LlamaForCausalLM
from engine.request import SamplingParams
from engine.runner.sampler import sample
from engine.scheduler.output import ScheduledUnit, SchedulerOutput


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, attn_backend, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, seed: int):
        self.model, self.attn_backend, self.block_size, self.device = model, attn_backend, block_size, device
        shape = attn_backend.kv_cache_shape(num_blocks, block_size)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(model.cfg.num_layers)]
        self.default_generator = torch.Generator(device="cpu").manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}  # requests with their own sampling seed

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        """Run one iteration; return the sampled token for each unit that completes its request's tokens."""
        for request_id in scheduler_output.finished_request_ids:
            self.generators.pop(request_id, None)
        units = scheduler_output.units  # decodes first
        input_ids, positions, meta = self._prepare(units)
        sampling = [u for u in units if u.samples]
        token_ends = itertools.accumulate(u.num_new_tokens for u in units)  # flat index + 1 of each unit's last token
        logits_indices = torch.tensor([end - 1 for u, end in zip(units, token_ends, strict=True) if u.samples],
                                      dtype=torch.long, device=self.device)
        logits = self.model(input_ids, positions, self.attn_backend, self.kv_caches, meta, logits_indices)
        tokens = sample(logits.cpu(), [u.sampling_params for u in sampling],
                        [self._generator(u.request_id, u.sampling_params) for u in sampling])
        return {u.request_id: t for u, t in zip(sampling, tokens, strict=True)}

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        if params.seed is None:
            return self.default_generator
        if request_id not in self.generators:
            self.generators[request_id] = torch.Generator().manual_seed(params.seed)
        return self.generators[request_id]

    def _prepare(self, units: list[ScheduledUnit]):
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        prefills: list[PrefillSeq] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        for u in units:
            start, n, table = u.num_computed_tokens, u.num_new_tokens, u.block_table
            ids.extend(u.token_ids)
            positions = range(start, start + n)
            pos.extend(positions)
            slots.extend(table[p // bs] * bs + p % bs for p in positions)
            if u.is_prefill:
                prefills.append(PrefillSeq(len(ids) - n, n, start,
                                           torch.tensor(table, dtype=torch.long, device=dev)))
            else:
                decode_tables.append(table)
                decode_lens.append(start + 1)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decodes=len(decode_tables), decode_block_tables=None, decode_seq_lens=None, prefills=prefills)
        if decode_tables:
            width = max(len(t) for t in decode_tables)
            meta.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables],
                                                    dtype=torch.long, device=dev)
            meta.decode_seq_lens = torch.tensor(decode_lens, dtype=torch.long, device=dev)
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev),
                meta)
