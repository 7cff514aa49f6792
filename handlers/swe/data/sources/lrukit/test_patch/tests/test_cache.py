import pytest

from lrukit import LRUCache


def test_put_and_get():
    cache = LRUCache(3)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zzz") is None
    assert cache.get("zzz", 0) == 0
    assert "a" in cache and len(cache) == 1


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert cache.stats.evictions == 1


def test_put_refreshes_recency():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]
    assert cache.peek("a") == 10


def test_stats():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert cache.stats.hit_rate == 0.5
    cache.stats.reset()
    assert cache.stats.hit_rate == 0.0


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_get_counts_as_a_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]
    assert cache.get("a") == 1 and "b" not in cache


def test_peek_does_not_count_as_a_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]
