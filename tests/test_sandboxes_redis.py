"""The Redis-backed loopback allocator and sandbox ledger, against a real redis-server."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import redis

from prorl_celery.sandboxes import RedisAddressAllocator, RedisSandboxLedger
from singularity.runtime import AddressExhausted, ProcessRef, SandboxRecord, reap_dead_owners

NODE = "node-a"


@pytest.fixture
def state_url(redis_url):
    url = redis_url + "/6"
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


def _allocate_many(url: str, worker: int, count: int) -> list[str]:
    allocator = RedisAddressAllocator(redis.Redis.from_url(url, decode_responses=True), NODE)
    with ThreadPoolExecutor(4) as threads:
        return list(threads.map(lambda i: allocator.allocate(f"w{worker}-{i}"), range(count)))


def test_500_concurrent_allocations_from_several_processes(state_url):
    with ProcessPoolExecutor(5) as processes:
        batches = list(processes.map(_allocate_many, [state_url] * 5, range(5), [100] * 5))
    addresses = [a for batch in batches for a in batch]
    assert len(addresses) == len(set(addresses)) == 500
    assert all(a.startswith("127.100.") and not a.endswith((".0", ".255")) for a in addresses)
    allocator = RedisAddressAllocator(redis.Redis.from_url(state_url, decode_responses=True), NODE)
    assert len(allocator.leases()) == 500
    for address in addresses:
        allocator.release(address)
    assert allocator.leases() == {}


def test_nodes_are_separate_and_exhaustion_is_clear(state_url):
    client = redis.Redis.from_url(state_url, decode_responses=True)
    tiny = RedisAddressAllocator(client, NODE, network="127.200.0.0/30")  # two usable hosts
    other = RedisAddressAllocator(client, "node-b", network="127.200.0.0/30")
    assert {tiny.allocate("a"), tiny.allocate("b")} == {"127.200.0.1", "127.200.0.2"}
    with pytest.raises(AddressExhausted):
        tiny.allocate("c")
    assert other.allocate("a") == "127.200.0.1"
    with pytest.raises(ValueError):
        RedisAddressAllocator(client, NODE, network="10.0.0.0/24")


def test_a_late_release_does_not_free_an_address_leased_again(state_url, tmp_path):
    from singularity.runtime.addresses import FileAddressAllocator, MemoryAddressAllocator
    client = redis.Redis.from_url(state_url, decode_responses=True)
    for allocator in (RedisAddressAllocator(client, NODE), FileAddressAllocator(tmp_path / "leases.json"),
                      MemoryAddressAllocator()):
        address = allocator.allocate("sandbox-old")
        allocator.release(address, "sandbox-old")  # the first reaper of the old sandbox
        assert allocator.allocate("sandbox-new") == address  # handed out again at once
        allocator.release(address, "sandbox-old")  # a second reaper of the same old record
        assert allocator.leases() == {address: "sandbox-new"}, type(allocator).__name__
        allocator.release(address)  # without an owner: whoever holds it
        assert allocator.leases() == {}


def test_ledger_reaps_sandboxes_of_a_dead_owner(state_url):
    client = redis.Redis.from_url(state_url, decode_responses=True)
    ledger, allocator = RedisSandboxLedger(client), RedisAddressAllocator(client, NODE)
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    address = allocator.allocate("sb-1")
    ledger.record(SandboxRecord(sandbox_id="sb-1", node=NODE, job_id="j1", worker="w1",
                                owner=ProcessRef(pid=dead_owner.pid, start_time=1), runtime="process",
                                root=ProcessRef.of(orphan.pid), address=address))
    live = ProcessRef.of(os.getpid())
    ledger.record(SandboxRecord(sandbox_id="sb-2", node=NODE, job_id="j2", worker="w2", owner=live,
                                runtime="process", root=live))
    assert [r.sandbox_id for r in ledger.list(NODE)] == ["sb-1", "sb-2"]
    reports = reap_dead_owners(ledger, NODE, allocator=allocator, grace_s=1.0)
    assert [r.sandbox_id for r in reports] == ["sb-1"] and reports[0].left == []
    assert orphan.wait(10) is not None  # the orphaned sandbox process was stopped
    assert [r.sandbox_id for r in ledger.list(NODE)] == ["sb-2"]
    assert address not in allocator.leases()
