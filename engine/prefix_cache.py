"""The KV-cache manager with automatic prefix caching (``cache.enable_prefix_caching``).

A request's full blocks are named by a key chained over their tokens (engine/block_pool.py). When a request
is admitted, the leading blocks of its sequence that are cached are shared with it and counted as computed,
so every policy schedules, budgets and reserves only the rest. Its last token is always computed (a prompt
cached whole keeps its last block out of the hits), so no step writes into a shared block. A block is
offered to the cache once a finished step has written all of its tokens; it stays cached after its request
ends, and is evicted least recently used first when no free block is left. The blocks that an aborted or
failed request computed itself go back to the free list forgotten.
"""
from __future__ import annotations

from collections.abc import Sequence

from stallfree.engine.block_pool import BlockKey, PrefixBlockPool, extend_block_keys
from stallfree.engine.kv_cache import KVCacheManager, blocks_for
from stallfree.engine.request import Request, RequestStatus

UNCACHED_ENDINGS = (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)


class PrefixCachingKVCacheManager(KVCacheManager):
    caches_prefixes = True

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        super().__init__(num_blocks, block_size, watermark)
        self.free_blocks.clear()  # the pool's LRU queue is the free list
        self.pool = PrefixBlockPool(num_blocks)
        self.num_hit_blocks: dict[str, int] = {}  # per running request: its leading blocks taken from the cache
        self.num_offered: dict[str, int] = {}  # per running request: its leading blocks offered to the cache
        # Counted at each admission, as vLLM's prefix_cache_queries / prefix_cache_hits (in tokens).
        self.num_query_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_cached_free_blocks(self) -> int:
        return self.pool.num_cached_free

    @property
    def num_evictions(self) -> int:
        return self.pool.num_evictions

    def cached_prefix_tokens(self, request: Request) -> int:
        if request.request_id in self.block_tables:
            return 0
        return len(self._hits(request)) * self.block_size

    def try_allocate(self, request: Request, num_tokens: int, use_watermark: bool = True) -> bool:
        table = self.block_tables.get(request.request_id)
        watermark = self.watermark_blocks if use_watermark else 0
        if table is not None:  # a running request grows
            missing = -(-num_tokens // self.block_size) - len(table)
            if missing <= 0:  # most decodes: nothing to add
                return True
            if missing > self.pool.num_free - watermark:
                return False
            table.extend(self.pool.allocate(missing))
            return True
        pool, hits = self.pool, self._hits(request)
        missing = blocks_for(num_tokens, self.block_size) - len(hits)
        if missing + pool.num_free_taken_by(hits) > pool.num_free - watermark:
            return False
        pool.hold(hits)
        self.block_tables[request.request_id] = hits + pool.allocate(missing)
        self.num_hit_blocks[request.request_id] = self.num_offered[request.request_id] = len(hits)
        cached_tokens = len(hits) * self.block_size
        request.num_computed_tokens = cached_tokens
        self.num_query_tokens += request.num_tokens
        self.num_hit_tokens += cached_tokens
        if request.metrics.first_scheduled_time is None:  # a recompute after preemption keeps the first figure
            request.metrics.num_cached_tokens = cached_tokens
        return True

    def cache_computed(self, request: Request) -> None:
        request_id, block_size = request.request_id, self.block_size
        offered = self.num_offered.get(request_id)
        full = request.num_computed_tokens // block_size
        if offered is None or full <= offered:
            return
        keys = self._keys(request, full)
        table = self.block_tables[request_id]
        for index in range(offered, full):
            self.pool.cache(table[index], keys[index])
        self.num_offered[request_id] = full

    def free(self, request: Request) -> None:
        table = self.block_tables.pop(request.request_id, None)
        if table is None:
            return
        hit_blocks = self.num_hit_blocks.pop(request.request_id)
        self.num_offered.pop(request.request_id)
        self.pool.release(table, forget_from=hit_blocks if request.status in UNCACHED_ENDINGS else None)

    def reset_prefix_cache(self) -> int:
        return self.pool.reset()

    def take_in(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """Blocks for the full blocks of ``token_ids``, a prefix another engine computed
        (engine/distributed/kv_transfer.py), each held once and named in the cache: the ones cached here
        already are shared, the others allocated. The blocks and the indices of the allocated ones, whose KV the
        caller writes before any step runs; the caller lets go of the blocks (``let_go``) once the request that
        takes them as hits is admitted. None, with nothing held, when the free blocks less the watermark cannot
        take them now."""
        keys: list[BlockKey] = []
        extend_block_keys(keys, token_ids, self.block_size)
        pool = self.pool
        blocks = [pool.cached.get(key) for key in keys]
        shared = [block for block in blocks if block is not None]
        written = [index for index, block in enumerate(blocks) if block is None]
        if len(written) + pool.num_free_taken_by(shared) > pool.num_free - self.watermark_blocks:
            return None
        pool.hold(shared)
        for index, block in zip(written, pool.allocate(len(written)), strict=True):
            pool.cache(block, keys[index])
            blocks[index] = block
        return blocks, written

    def let_go(self, blocks: Sequence[int]) -> None:
        """Drop the hold ``take_in`` took: the blocks stay cached, evicted least recently used first."""
        self.pool.release(blocks)

    def _hits(self, request: Request) -> list[int]:
        """The cached blocks a request not yet admitted would share: its leading full blocks short of its last
        token. None for a request asking prompt_logprobs: those are computed for every prompt token."""
        if request.params.prompt_logprobs is not None:
            return []
        usable = (request.num_tokens - 1) // self.block_size
        return self.pool.lookup(self._keys(request, usable)[:usable])

    def _keys(self, request: Request, num_blocks: int) -> list[BlockKey]:
        """The keys of the request's full blocks, the first ``num_blocks`` at least (kept on the request, each
        made once)."""
        keys, block_size = request.block_keys, self.block_size
        if len(keys) < num_blocks:
            extend_block_keys(keys, request.token_ids(len(keys) * block_size, num_blocks * block_size), block_size)
        return keys
