"""Paged KV-cache block manager: a free list and one block table per request."""
from __future__ import annotations

from collections import deque

from engine.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        """Blocks still needed so that ``request`` has slots for ``num_tokens`` tokens."""
        have = len(self.block_tables.get(request.request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def can_allocate(self, request: Request, num_tokens: int, use_watermark: bool = True) -> bool:
        reserve = self.watermark_blocks if use_watermark else 0
        return self.num_missing_blocks(request, num_tokens) <= self.num_free_blocks - reserve

    def allocate(self, request: Request, num_tokens: int) -> None:
        missing = self.num_missing_blocks(request, num_tokens)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks for {request.request_id}")
        table = self.block_tables.setdefault(request.request_id, [])
        table.extend(self.free_blocks.popleft() for _ in range(missing))

    def free(self, request: Request) -> None:
        self.free_blocks.extend(self.block_tables.pop(request.request_id, ()))
