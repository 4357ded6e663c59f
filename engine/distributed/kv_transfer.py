"""A prompt's KV moved from one engine to another: how a disaggregated deployment hands a request that a prefill
instance computed to a decode instance.

The prefill side reads the KV of the prompt's full blocks out of its prefix cache (``export_prefix``); the
decode side writes it into blocks of its own prefix cache, named by the same tokens (``import_prefix``). The
request, added there, takes those blocks as cache hits and computes only the rest of its prompt: at least its
last token, at most one block's tokens, as any prompt cached whole. Blocks are named by their tokens on each
side, never by a hash sent along: Python's hashes differ between processes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stallfree.engine.block_pool import BlockKey, extend_block_keys
from stallfree.engine.prefix_cache import PrefixCachingKVCacheManager


@dataclass
class PrefixKv:
    """The KV of a prompt's leading full blocks."""

    token_ids: list[int]  # the tokens whose KV this is: whole blocks
    kv: torch.Tensor  # [layers, 2 (K then V), one layer's cache shape with the blocks on its block axis]
    block_size: int

    @property
    def num_blocks(self) -> int:
        return len(self.token_ids) // self.block_size

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def _caches(kv: Any, runner: Any) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The runner's per-layer (K, V) caches and the axis their blocks lie along; ValueError where a prefix
    cannot be moved."""
    if not isinstance(kv, PrefixCachingKVCacheManager):
        raise ValueError("moving a prompt's KV needs the prefix-caching KV manager (cache.enable_prefix_caching)")
    caches = getattr(runner, "kv_caches", None)
    if caches is None:
        raise ValueError(f"moving a prompt's KV needs the model's KV cache in this process; the runner is "
                         f"{type(runner).__name__}")
    one, two = (runner.attn_backend.kv_cache_shape(n, kv.block_size) for n in (1, 2))
    return caches, next(axis for axis, (a, b) in enumerate(zip(one, two, strict=True)) if a != b)


def export_prefix(kv: PrefixCachingKVCacheManager, runner: Any, token_ids: Sequence[int]) -> PrefixKv:
    """The KV of the leading full blocks of ``token_ids`` short of its last token (what a request of that prompt
    could take from a cache) that ``kv``'s cache holds, up to the first one it does not."""
    caches, axis = _caches(kv, runner)
    block_size = kv.block_size
    keys: list[BlockKey] = []
    extend_block_keys(keys, token_ids[:(len(token_ids) - 1) // block_size * block_size], block_size)
    blocks = torch.tensor(kv.pool.lookup(keys), dtype=torch.long, device=caches[0][0].device)
    data = torch.stack([torch.stack([k.index_select(axis, blocks), v.index_select(axis, blocks)])
                        for k, v in caches])
    return PrefixKv(list(token_ids[:len(blocks) * block_size]), data, block_size)


def import_prefix(kv: PrefixCachingKVCacheManager, runner: Any, prefix: PrefixKv) -> list[int] | None:
    """Write ``prefix`` into ``kv``'s cache, its blocks held and named by their tokens; the caller lets go of them
    (``kv.let_go``) once the request that takes them is admitted. None, with nothing written, when the cache
    cannot take them now: the transfer waits. ValueError for KV of another shape."""
    caches, axis = _caches(kv, runner)
    k_cache = caches[0][0]
    expected = (len(caches), 2, *k_cache.shape[:axis], prefix.num_blocks, *k_cache.shape[axis + 1:])
    if prefix.block_size != kv.block_size or tuple(prefix.kv.shape) != expected or prefix.kv.dtype != k_cache.dtype:
        raise ValueError(f"KV of shape {tuple(prefix.kv.shape)} {prefix.kv.dtype} in blocks of "
                         f"{prefix.block_size} cannot go into a cache of {expected} {k_cache.dtype} in blocks of "
                         f"{kv.block_size}: the two engines must run the same model, dtype and block size")
    taken = kv.take_in(prefix.token_ids)
    if taken is None:
        return None
    blocks, written = taken
    if written:
        source = torch.tensor(written, dtype=torch.long, device=prefix.kv.device)
        target = torch.tensor([blocks[index] for index in written], dtype=torch.long, device=k_cache.device)
        for layer, (k, v) in enumerate(caches):
            for cache, part in ((k, 0), (v, 1)):
                cache.index_copy_(axis, target, prefix.kv[layer, part].index_select(axis, source).to(cache.device))
    return blocks
