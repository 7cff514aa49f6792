"""The Redis-backed loopback allocator and sandbox ledger, against a real redis-server."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import redis

from handlers import SandboxRequest
from prorl_celery.job_sandboxes import JobSandboxes
from prorl_celery.node_sandboxes import RedisAddressAllocator, RedisSandboxLedger
from singularity.runtime import (
    RUNTIMES,
    AddressExhausted,
    ProcessRef,
    SandboxLedger,
    SandboxRecord,
    procfs,
    reap,
)
from tests.support.sandboxes import FirstStopFails

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
    reports = reap(ledger, NODE, allocator=allocator, grace_s=1.0)
    assert [r.sandbox_id for r in reports] == ["sb-1"] and reports[0].left == []
    assert orphan.wait(10) is not None  # the orphaned sandbox process was stopped
    assert [r.sandbox_id for r in ledger.list(NODE)] == ["sb-2"]
    assert address not in allocator.leases()


def test_a_job_sandbox_whose_stop_failed_is_reaped_while_its_worker_lives(state_url, tmp_path, monkeypatch):
    """A worker's failed stop stays in the Redis ledger and the worker's reaper tick retries it
    (the same one every worker runs): the sandbox is gone although its owner never died."""
    monkeypatch.setitem(RUNTIMES, "first-stop-fails", FirstStopFails)
    client = redis.Redis.from_url(state_url, decode_responses=True)
    jobs = JobSandboxes(client, node=NODE, runtime="first-stop-fails", root=str(tmp_path))
    assert isinstance(jobs.ledger, SandboxLedger)  # get and transfer are in the protocol
    sandbox = asyncio.run(jobs.start("job-1", SandboxRequest()))
    [record] = jobs.ledger.list(NODE)
    seen = procfs.members(record.root, record.pidns, record.refs)
    assert len(seen) >= 2
    asyncio.run(jobs.stop(sandbox))  # fails: logged, kept for a retry
    assert jobs.runtime.failed_stops == 1
    assert all(procfs.is_alive(ProcessRef(pid=i.pid, start_time=i.start_time)) for i in seen)
    [failed] = jobs.ledger.list(NODE)
    assert failed.sandbox_id == sandbox["id"] and failed.stop_failures == 1 and failed.retry_at > time.time()
    assert os.path.isdir(sandbox["workspace"])  # may still be in use
    assert procfs.is_alive(failed.owner) and jobs.reap() == 0  # not due yet
    time.sleep(max(0.0, failed.retry_at - time.time()))
    assert jobs.reap() == 1
    assert procfs.wait_until(lambda: not procfs.members(record.root, record.pidns, record.refs), 10)
    for info in seen:
        assert not procfs.is_alive(ProcessRef(pid=info.pid, start_time=info.start_time))
    assert jobs.ledger.list(NODE) == [] and jobs.allocator.leases() == {}
    assert not os.path.exists(sandbox["workspace"]) and not os.path.exists(record.state_dir)


class ChangedAfterRead(redis.Redis):
    """A client after whose first HGET another worker changes that entry at once, through its
    own connection (``change(other_client, key, field, entry)``): the race a transfer (read,
    then write) must survive."""

    change = None

    def hget(self, name, key):
        entry = super().hget(name, key)
        if self.change is not None:
            change, self.change = self.change, None
            change(redis.Redis.from_url(self.url, decode_responses=True), name, key, entry)
        return entry


def _changed_after_read(url: str, change) -> ChangedAfterRead:
    client = ChangedAfterRead.from_url(url, decode_responses=True)
    client.url, client.change = url, change
    return client


def test_transfer_is_atomic_against_a_stop_or_a_failed_stop_in_between(state_url):
    """RUN adopts INIT's sandbox while another worker stops it (/stop, /cancel, the reaper): a
    stop landing between the transfer's read and write used to be undone, the entry re-created
    with RUN as owner; a failed stop marked in between was overwritten."""
    me = ProcessRef.of(os.getpid())
    entry = SandboxRecord(sandbox_id="sb-1", node=NODE, job_id="j1", worker="init-w", owner=me,
                          runtime="process", root=me, refs=[])

    def stopped(other, name, key, _entry):
        other.hdel(name, key)

    def marked(other, name, key, raw):
        other.hset(name, key, SandboxRecord.model_validate_json(raw).model_copy(
            update={"stop_failures": 1, "retry_at": 123.5}).model_dump_json())

    plain = RedisSandboxLedger(redis.Redis.from_url(state_url, decode_responses=True))
    plain.record(entry)
    assert RedisSandboxLedger(_changed_after_read(state_url, stopped)).transfer(NODE, "sb-1", me, "run-w") is False
    assert plain.get(NODE, "sb-1") is None and plain.list(NODE) == []

    plain.record(entry)
    assert RedisSandboxLedger(_changed_after_read(state_url, marked)).transfer(NODE, "sb-1", me, "run-w") is True
    moved = plain.get(NODE, "sb-1")
    assert moved is not None and (moved.worker, moved.stop_failures, moved.retry_at) == ("run-w", 1, 123.5)
    assert plain.transfer(NODE, "missing", me, "run-w") is False
