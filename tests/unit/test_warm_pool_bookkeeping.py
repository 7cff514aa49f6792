"""The warm pool's bookkeeping (no sandbox started: the pool is empty, so every take is a miss;
tests/integration/test_warm_pool.py runs it with real sandboxes)."""
from __future__ import annotations

from handlers import SandboxRequest
from prorl_celery.worker.warm_pool import MAX_KINDS, Pooled, WarmPool, kind_label, parse_presets


def test_presets_name_an_image_and_its_tools():
    assert parse_presets(" dev+python, dev ,") == [SandboxRequest(tools=("python",)), SandboxRequest()]
    assert parse_presets("") == []


def test_a_kind_is_named_by_image_and_tools_and_marked_when_it_differs_otherwise():
    assert kind_label(SandboxRequest(tools=("search", "python"))) == "dev+search+python"
    assert kind_label(SandboxRequest(max_processes=256)).startswith("dev*")
    assert kind_label(SandboxRequest(max_processes=256)) != kind_label(SandboxRequest(max_processes=128))


def test_a_miss_makes_its_request_a_kind_the_pool_keeps_and_counts_it():
    counted = []
    pool = WarmPool(None, size=2, max_mb=100, presets=parse_presets("dev+python"),
                    count=lambda name, amount: counted.append((name, amount)))
    assert pool.take(SandboxRequest(max_processes=256)) is None
    assert pool.take(SandboxRequest(tools=("python",))) is None
    stats = pool.stats()
    assert stats["kinds"] == {"dev+python": 0, kind_label(SandboxRequest(max_processes=256)): 0}
    assert (stats["hits"], stats["misses"], stats["ready"], stats["refill_s_p50"]) == (0, 2, 0, None)
    assert counted == [("warm_pool_misses", 1)] * 2
    # the emptiest kind first, the most recently asked-for among equals
    assert pool._next_kind() == SandboxRequest(tools=("python",))


def test_the_least_recently_asked_for_kinds_are_dropped_beyond_the_limit():
    pool = WarmPool(None, size=1, max_mb=100)
    kinds = [SandboxRequest(max_processes=100 + i) for i in range(MAX_KINDS + 2)]
    for kind in kinds:
        pool.take(kind)
    pool.take(kinds[0])  # too old: dropped, then asked for again
    assert len(pool.stats()["kinds"]) == MAX_KINDS
    assert pool._next_kind() == kinds[0]


def test_a_closed_pool_keeps_no_new_kind_and_fills_nothing():
    pool = WarmPool(None, size=1, max_mb=100)
    pool.close()
    assert pool.take(SandboxRequest()) is None
    assert pool.stats()["kinds"] == {} and pool._next_kind() is None


def test_the_pool_fills_no_further_than_its_memory_bound():
    pool = WarmPool(None, size=4, max_mb=200, presets=[SandboxRequest()])
    assert pool._next_kind() == SandboxRequest()  # nothing measured yet: the first one is started
    pool._ready[SandboxRequest()].extend(Pooled({"id": str(i)}, None, None, 80.0) for i in range(2))
    pool._rss_estimate_mb = 80.0
    assert pool._next_kind() is None  # 160 held + 80 more > 200
    pool._ready[SandboxRequest()].pop()
    assert pool._next_kind() == SandboxRequest()
    assert pool.stats()["rss_mb"] == 80.0 and pool.stats()["ready"] == 1
