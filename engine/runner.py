"""ModelRunner: a scheduled Batch -> flat tensors -> one forward pass -> sampled tokens."""
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, PrefillSeq
from engine.kv_cache import KVCacheManager
from engine.model.llama import LlamaForCausalLM
from engine.request import Request
from engine.sampler import sample
from engine.scheduler import Batch, ScheduledUnit


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, attn_backend, kv: KVCacheManager, num_blocks: int,
                 dtype: torch.dtype, device: torch.device, seed: int):
        cfg = model.cfg
        self.model, self.attn_backend, self.kv, self.device = model, attn_backend, kv, device
        self.block_size = kv.block_size
        shape = attn_backend.kv_cache_shape(num_blocks, self.block_size)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(cfg.num_layers)]
        self.default_generator = torch.Generator(device="cpu").manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}

    @torch.inference_mode()
    def execute(self, batch: Batch) -> dict[str, int]:
        """Run one iteration; return the sampled token for each request whose unit completes its tokens."""
        units = sorted(batch.units, key=lambda u: u.is_prefill)  # decodes first (stable)
        input_ids, positions, meta = self._prepare(units)
        sampling = [(i, u.request) for i, u in enumerate(self._token_ends(units)) if u is not None]
        logits_indices = torch.tensor([i for i, _ in sampling], dtype=torch.long, device=self.device)
        logits = self.model(input_ids, positions, self.attn_backend, self.kv_caches, meta, logits_indices)
        requests = [r for _, r in sampling]
        tokens = sample(logits.cpu(), [r.params for r in requests], [self._generator(r) for r in requests])
        return {r.request_id: t for r, t in zip(requests, tokens, strict=True)}

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    def _generator(self, request: Request) -> torch.Generator | None:
        if request.params.greedy:
            return None
        if request.params.seed is None:
            return self.default_generator
        if request.request_id not in self.generators:
            self.generators[request.request_id] = torch.Generator().manual_seed(request.params.seed)
        return self.generators[request.request_id]

    @staticmethod
    def _token_ends(units: list[ScheduledUnit]) -> list[ScheduledUnit | None]:
        """Per flat token: the unit if it is the unit's last token and the unit samples, else None."""
        ends: list[ScheduledUnit | None] = []
        for u in units:
            ends.extend([None] * (u.num_new_tokens - 1))
            ends.append(u if u.samples else None)
        return ends

    def _prepare(self, units: list[ScheduledUnit]):
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        prefills: list[PrefillSeq] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        for u in units:
            r, start, n = u.request, u.request.num_computed_tokens, u.num_new_tokens
            table = self.kv.block_tables[r.request_id]
            ids.extend(r.all_token_ids[start:start + n])
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
