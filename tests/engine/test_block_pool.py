"""The prefix block pool: keys chained over tokens, sharing by reference count, LRU eviction."""
import pytest

from stallfree.engine.block_pool import PrefixBlockPool, extend_block_keys


def keys_of(tokens, block_size=4):
    keys = []
    extend_block_keys(keys, tokens, block_size)
    return keys


def test_keys_cover_full_blocks_and_chain_on_the_parent():
    a = keys_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2  # the partial third block has no key
    b = keys_of([0, 2, 3, 4, 5, 6, 7, 8])
    assert a[1][1] == b[1][1] and a[1] != b[1]  # same tokens, other parent: another block
    extended = keys_of([1, 2, 3, 4])
    extend_block_keys(extended, [5, 6, 7, 8, 9], 4)  # from block 1 on
    assert extended == a


def cached_pool(num_blocks=6, tokens=tuple(range(12))):
    """A pool with one request's three blocks cached and released."""
    pool = PrefixBlockPool(num_blocks)
    blocks = pool.allocate(3)
    for block, key in zip(blocks, keys_of(list(tokens)), strict=True):
        pool.cache(block, key)
    pool.release(blocks)
    return pool, blocks


def test_released_blocks_stay_cached_and_are_shared():
    pool, blocks = cached_pool()
    assert pool.num_free == 6 and pool.num_cached_free == 3
    keys = keys_of(list(range(8)) + [99, 98, 97, 96])
    hits = pool.lookup(keys)
    assert hits == blocks[:2]  # the third block differs
    pool.hold(hits)
    pool.hold(hits)  # a second request shares them
    assert pool.ref_counts[blocks[0]] == 2 and pool.num_free == 4 and pool.num_cached_free == 1
    pool.release(hits)
    assert pool.num_free == 4
    pool.release(hits)
    assert pool.num_free == 6 and pool.num_cached_free == 3


def test_eviction_takes_uncached_blocks_then_the_least_recently_used():
    pool, blocks = cached_pool()
    fresh = pool.allocate(3)
    assert set(fresh).isdisjoint(blocks) and pool.num_evictions == 0
    evicted = pool.allocate(1)
    # released last block first: the table's tail is evicted before its head
    assert evicted == [blocks[2]] and pool.num_evictions == 1
    assert pool.lookup(keys_of(list(range(12)))) == blocks[:2]


def test_a_block_used_again_is_evicted_last():
    pool, blocks = cached_pool()
    pool.hold([blocks[2]])
    pool.release([blocks[2]])  # now the most recently used
    pool.allocate(3)
    assert pool.allocate(2) == [blocks[1], blocks[0]]
    assert pool.keys[blocks[2]] is not None and pool.num_cached_free == 1


def test_forgotten_blocks_go_to_the_front_uncached():
    pool = PrefixBlockPool(4)
    blocks = pool.allocate(2)
    for block, key in zip(blocks, keys_of(list(range(8))), strict=True):
        pool.cache(block, key)
    pool.release(blocks, forget_from=1)
    assert pool.lookup(keys_of(list(range(8)))) == [blocks[0]]
    assert pool.num_cached_free == 1
    assert pool.allocate(1) == [blocks[1]] and pool.num_evictions == 0


def test_a_key_cached_twice_stays_with_its_first_block():
    pool = PrefixBlockPool(4)
    a, b = pool.allocate(2)
    key = keys_of([1, 2, 3, 4])[0]
    pool.cache(a, key)
    pool.cache(b, key)
    assert pool.lookup([key]) == [a] and pool.keys[b] is None


def test_misuse_is_refused():
    pool = PrefixBlockPool(2)
    with pytest.raises(ValueError, match="free"):
        pool.cache(0, keys_of([1, 2, 3, 4])[0])
    with pytest.raises(ValueError, match="3 blocks asked, 2 free"):
        pool.allocate(3)
    block = pool.allocate(1)
    pool.release(block)
    with pytest.raises(ValueError, match="released more often"):
        pool.release(block)


def test_reset_forgets_everything():
    pool, blocks = cached_pool()
    assert pool.reset() == 3
    assert pool.lookup(keys_of(list(range(12)))) == [] and pool.num_cached_free == 0 and pool.num_free == 6
