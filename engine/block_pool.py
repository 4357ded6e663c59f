"""Automatic prefix caching: a pool of KV blocks, each full block named by its tokens and its parent's name,
shared by reference count and kept once released until it is evicted, least recently used first (the
behaviour of vLLM V1's ``block_pool.py`` and nano-vllm's ``block_manager.py``).

A block is *held* (reference count >= 1: in some running request's block table) or *free* (count 0, in the
LRU queue). A free block may still be *cached*: its KV is valid and a request whose prompt starts with the
same tokens takes it back instead of computing them. Free blocks are handed out from the front of the queue;
a cached one handed out is evicted (its name forgotten).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

# A full block's name: its parent's chain hash (None for the first block) and its token ids. Looked up
# exactly (dict equality on the tuple), so two prefixes that differ share no block, whatever their hashes.
BlockKey = tuple[int | None, tuple[int, ...]]


def extend_block_keys(keys: list[BlockKey], token_ids: Sequence[int], block_size: int) -> None:
    """Append to ``keys`` (a sequence's leading full blocks) the keys of the full blocks in ``token_ids``,
    the sequence's tokens from block ``len(keys)`` on, each chained on its parent's hash."""
    parent = hash(keys[-1]) if keys else None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = (parent, tuple(token_ids[start:start + block_size]))
        keys.append(key)
        parent = hash(key)


class PrefixBlockPool:
    """``num_blocks`` KV blocks with reference counts, names for the cached ones and an LRU free queue."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.keys: list[BlockKey | None] = [None] * num_blocks
        self.cached: dict[BlockKey, int] = {}  # key -> block, for free and held blocks alike
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # front: evicted first
        self.num_evictions = 0  # cached blocks handed out for other tokens
        self.num_cached_free = 0  # free blocks whose KV is cached (evictable)

    @property
    def num_free(self) -> int:
        """Blocks no request holds, cached or not: all can be handed out."""
        return len(self.free_queue)

    def lookup(self, keys: Iterable[BlockKey]) -> list[int]:
        """The cached blocks of the leading ``keys``, up to the first key not cached."""
        hits = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_free_taken_by(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` are free now (holding them takes them off the free queue)."""
        return sum(self.ref_counts[block] == 0 for block in blocks)

    def hold(self, blocks: Iterable[int]) -> None:
        """Take a reference to each of ``blocks`` (cached blocks a request shares)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
                self.num_cached_free -= self.keys[block] is not None
            self.ref_counts[block] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks from the front of the free queue, each held once; a cached one is evicted. The caller
        checks ``num_free`` first."""
        if n > len(self.free_queue):
            raise ValueError(f"{n} blocks asked, {len(self.free_queue)} free")
        blocks = []
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=False)
            if self.keys[block] is not None:
                self._forget(block)
                self.num_evictions += 1
                self.num_cached_free -= 1
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int], forget_from: int | None = None) -> None:
        """Drop one reference to each of ``blocks`` (a block table, first block first). A block no one holds
        any more goes to the back of the free queue, its cache entry kept; from index ``forget_from`` on it
        goes to the front instead, forgotten. A table's last blocks are queued first: they are evicted before
        its first ones, which more prompts share."""
        forget_from = len(blocks) if forget_from is None else forget_from
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            count = self.ref_counts[block] - 1
            if count < 0:
                raise ValueError(f"block {block} released more often than it was held")
            self.ref_counts[block] = count
            if count:
                continue
            if index < forget_from or self.keys[block] is None:
                self.free_queue[block] = None
                self.num_cached_free += self.keys[block] is not None
            else:
                self._forget(block)
                self.free_queue[block] = None
                self.free_queue.move_to_end(block, last=False)

    def cache(self, block: int, key: BlockKey) -> None:
        """Name a held block whose KV is fully written; a key already cached in another block stays there."""
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} is free: only a held block can be cached")
        if key not in self.cached and self.keys[block] is None:
            self.cached[key] = block
            self.keys[block] = key

    def reset(self) -> int:
        """Forget every cached block (their KV stays where it is until overwritten); how many there were."""
        forgotten = len(self.cached)
        self.cached.clear()
        self.keys = [None] * self.num_blocks
        self.num_cached_free = 0
        return forgotten

    def _forget(self, block: int) -> None:
        del self.cached[self.keys[block]]
        self.keys[block] = None
