"""Paged KV-cache block manager: a free list and one block table per request."""
from __future__ import annotations

from collections import deque

from stallfree.engine.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Without prefix caching: each request's blocks are its own, and back on the free list when it ends.
    engine/prefix_cache.py's manager shares cached prefix blocks behind the same methods."""

    caches_prefixes = False  # the scheduler calls cache_computed after each step only where this is true
    # Prefix-cache counters (in tokens, at admissions; blocks evicted), kept by the caching manager.
    num_query_tokens = num_hit_tokens = num_evictions = 0

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no running request holds (cached ones included: they can be evicted)."""
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by running requests."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that hold a cached prefix."""
        return 0

    def cached_prefix_tokens(self, request: Request) -> int:
        """The tokens of a request not yet admitted that admitting it now would take from the cache."""
        return 0

    def try_allocate(self, request: Request, num_tokens: int, use_watermark: bool = True) -> bool:
        """Give ``request`` slots for ``num_tokens`` tokens if the free blocks (less the watermark) allow;
        False, and nothing allocated, if they do not."""
        table = self.block_tables.get(request.request_id)
        if table is not None and len(table) * self.block_size >= num_tokens:  # most decodes: nothing to add
            return True
        missing = -(-num_tokens // self.block_size) - (len(table) if table is not None else 0)
        if missing > len(self.free_blocks) - (self.watermark_blocks if use_watermark else 0):
            return False
        if table is None:
            table = self.block_tables[request.request_id] = []
        popleft = self.free_blocks.popleft
        table.extend(popleft() for _ in range(missing))
        return True

    def cache_computed(self, request: Request) -> None:
        """Offer the request's fully computed blocks to the cache (after a step advanced it)."""

    def free(self, request: Request) -> None:
        self.free_blocks.extend(self.block_tables.pop(request.request_id, ()))

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix; how many blocks were cached."""
        return 0
