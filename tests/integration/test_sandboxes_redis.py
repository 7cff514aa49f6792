"""The Redis-backed loopback allocator and sandbox ledger, against a real redis-server."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import redis

from handlers import SandboxRequest
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state.store import JobStore
from prorl_celery.worker.job_sandboxes import JobSandboxes, tool_client
from prorl_celery.worker.node_sandboxes import RedisAddressAllocator, RedisSandboxLedger
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


# -- a sandbox belongs to its job, not to the worker that started it ---------------------------------

class _Jobs:
    """Jobs moved through the store's real transitions to where a sandbox's holder may be."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def init(self, job_id: str, sandbox_id: str, init_pid: int) -> None:
        """In INIT, whose worker ``init_pid`` started ``sandbox_id`` and wrote it to the record."""
        self.store.create(job_id, {"task": "noop", "instance": {}})
        assert self.store.claim_stage(job_id, Stage.INIT, {"init_node": NODE, "worker_pid": init_pid}).ok
        assert self.store.update(job_id, {"sandbox": {"id": sandbox_id, "node": NODE}}, attempt=1,
                                 status=JobStatus.INIT)

    def handed(self, job_id: str, sandbox_id: str, init_pid: int) -> None:
        """Handed to RUN: waiting in ``pending_run`` with its sandbox."""
        self.init(job_id, sandbox_id, init_pid)
        assert self.store.hand_over(job_id, Stage.INIT, {"run_queue": f"run.{NODE}"}, attempt=1).ok

    def running(self, job_id: str, sandbox_id: str, init_pid: int, run_pid: int, node: str = NODE) -> None:
        """Claimed by the RUN worker ``run_pid`` on ``node``."""
        self.handed(job_id, sandbox_id, init_pid)
        assert self.store.claim_stage(job_id, Stage.RUN, {"run_node": node, "worker_pid": run_pid}).ok

    def evaluating(self, job_id: str, sandbox_id: str, pid: int) -> None:
        """Claimed by the EVAL worker ``pid`` (RUN over)."""
        self.running(job_id, sandbox_id, pid, pid)
        assert self.store.hand_over(job_id, Stage.RUN, {}, attempt=1).ok
        assert self.store.claim_stage(job_id, Stage.EVAL, {"eval_node": NODE, "worker_pid": pid}).ok


def _dead_process() -> ProcessRef:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return ProcessRef(pid=dead.pid, start_time=1)


def test_a_dead_owners_sandbox_is_still_needed_only_while_its_job_holds_it(state_url, tmp_path):
    """INIT's worker died (the sandboxes' owner): a job that INIT handed to RUN keeps the very
    sandbox its record names, while no RUN has claimed it or while the RUN that claimed it
    lives; anything else is the reaper's."""
    client = redis.Redis.from_url(state_url, decode_responses=True)
    sandboxes = JobSandboxes(client, node=NODE, runtime="process", root=str(tmp_path))
    jobs = _Jobs(JobStore(client, result_ttl_s=60))
    gone = _dead_process()
    jobs.init("in-init", "sb-init", gone.pid)
    jobs.handed("handed", "sb-handed", gone.pid)
    jobs.handed("retried", "sb-new", gone.pid)
    jobs.running("run-live", "sb-run-live", gone.pid, os.getpid())
    jobs.running("run-dead", "sb-run-dead", gone.pid, gone.pid)
    jobs.running("run-elsewhere", "sb-elsewhere", gone.pid, os.getpid(), node="node-b")
    jobs.handed("cancelled", "sb-cancelled", gone.pid)
    assert jobs.store.cancel("cancelled").ok
    expected = {("in-init", "sb-init"): False,  # its INIT died with the owner: retried, a new sandbox
                ("handed", "sb-handed"): True,  # RUN will adopt it
                ("retried", "sb-old"): False,  # the record names another sandbox
                ("run-live", "sb-run-live"): True,  # its RUN lives and adopts it
                ("run-dead", "sb-run-dead"): False,  # its RUN died: never adopted, retried from INIT
                ("run-elsewhere", "sb-elsewhere"): False,  # a RUN on another node cannot use it
                ("cancelled", "sb-cancelled"): False,
                ("no-such-job", "sb-gone"): False,
                ("handed-eval", "sb-eval"): False}  # an EVAL sandbox: its worker's alone
    found = {(job_id, sandbox_id): sandboxes.still_needed(SandboxRecord(
        sandbox_id=sandbox_id, node=NODE, job_id=job_id, worker="init", owner=gone, runtime="process", root=None))
        for job_id, sandbox_id in expected}
    assert found == expected


def test_a_live_owners_sandbox_is_released_once_its_job_moved_on_without_it(state_url, tmp_path):
    """The owner lives (INIT's worker, or a RUN's): its sandbox is in use, unless the job let go
    of it. The case that leaked: the RUN that claimed the job died before it adopted the
    sandbox, so INIT's live worker still owns it while the job is retried or ended."""
    client = redis.Redis.from_url(state_url, decode_responses=True)
    sandboxes = JobSandboxes(client, node=NODE, runtime="process", root=str(tmp_path))
    jobs = _Jobs(JobStore(client, result_ttl_s=60))
    me, gone = os.getpid(), _dead_process()
    jobs.init("in-init", "sb-init", me)
    jobs.handed("handed", "sb-handed", me)
    jobs.handed("retried", "sb-new", me)
    jobs.running("run-live", "sb-run-live", me, me)
    jobs.running("run-unadopted", "sb-unadopted", me, gone.pid)
    jobs.running("run-elsewhere", "sb-elsewhere", me, me, node="node-b")
    jobs.running("run-fresh", "sb-diverged", me, me)
    jobs.handed("cancelled", "sb-cancelled", me)
    assert jobs.store.cancel("cancelled").ok
    jobs.evaluating("judged", "sb-judged", me)
    expected = {("in-init", "sb-init"): False,  # INIT may be starting it for this very attempt
                ("in-init", "sb-earlier"): False,  # nor can an earlier attempt's be told apart yet
                ("handed", "sb-handed"): False,  # RUN will adopt it
                ("retried", "sb-old"): True,  # the record names another sandbox
                ("run-live", "sb-run-live"): False,  # its RUN lives and adopts it
                ("run-unadopted", "sb-unadopted"): True,  # its RUN died before adopting it
                ("run-elsewhere", "sb-elsewhere"): True,  # a RUN on another node cannot use it
                ("run-fresh", "sb-fresh"): False,  # its own RUN starts it (a resume that diverged)
                ("cancelled", "sb-cancelled"): True,
                ("no-such-job", "sb-pool"): False,  # a warm pool's own: no job names it
                ("judged-eval", "sb-eval"): False,  # an EVAL sandbox of a job in EVAL: in use
                # an EVAL sandbox whose job is not in EVAL (or gone): an EVAL's failed stop
                ("handed-eval", "sb-eval-old"): True,
                ("cancelled-eval", "sb-eval-cancelled"): True,
                ("no-such-job-eval", "sb-eval-gone"): True}
    owner = ProcessRef.of(me)
    assert owner is not None
    found = {(job_id, sandbox_id): sandboxes.released(SandboxRecord(
        sandbox_id=sandbox_id, node=NODE, job_id=job_id, worker="w", owner=owner, runtime="process", root=None))
        for job_id, sandbox_id in expected}
    assert found == expected


def test_the_reaper_stops_a_sandbox_its_live_owner_was_left_with(state_url, tmp_path):
    """A sandbox this (live) process started for a job whose RUN died before adopting it is
    stopped on the next tick, its workspace and address with it; one a job in ``pending_run``
    holds is kept."""
    client = redis.Redis.from_url(state_url, decode_responses=True)
    sandboxes = JobSandboxes(client, node=NODE, runtime="process", root=str(tmp_path))
    jobs = _Jobs(JobStore(client, result_ttl_s=60))
    sandbox = asyncio.run(sandboxes.start("lost-run", SandboxRequest()))
    gone = _dead_process()
    jobs.running("lost-run", sandbox["id"], os.getpid(), gone.pid)
    [record] = sandboxes.ledger.list(NODE)
    assert procfs.members(record.root, record.pidns, record.refs)
    assert sandboxes.reap() == 1  # not alive on this node: the job no longer holds it
    assert procfs.wait_until(lambda: not procfs.members(record.root, record.pidns, record.refs), 10)
    assert sandboxes.ledger.list(NODE) == [] and not os.path.exists(sandbox["workspace"])
    assert sandboxes.allocator.leases() == {}

    kept = asyncio.run(sandboxes.start("kept", SandboxRequest()))
    jobs.handed("kept", kept["id"], os.getpid())
    assert sandboxes.reap() == 0 and [r.sandbox_id for r in sandboxes.ledger.list(NODE)] == [kept["id"]]
    asyncio.run(sandboxes.stop(kept))
    assert sandboxes.ledger.list(NODE) == []


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap (bwrap) is not installed")
def test_the_init_workers_death_leaves_the_sandboxes_it_handed_to_run(state_url, tmp_path):
    """The service's sandboxes do not die with their starter (no ``--die-with-parent``), and the
    node's reaper stops a dead starter's sandbox only once its job let go of it: the sandbox of
    a job in ``pending_run`` survives until RUN adopts and stops it; one whose job is still in
    ``init`` is reaped."""
    client = redis.Redis.from_url(state_url, decode_responses=True)
    sandboxes = JobSandboxes(client, node=NODE, runtime="bubblewrap", root=str(tmp_path))
    jobs = _Jobs(JobStore(client, result_ttl_s=60))

    async def start(job_id: str) -> dict[str, str]:
        return await sandboxes.start(job_id, SandboxRequest())
    handed, in_init = asyncio.run(start("handed")), asyncio.run(start("in-init"))
    assert not sandboxes.runtime.die_with_parent
    gone = _dead_process()
    jobs.handed("handed", handed["id"], gone.pid)
    jobs.init("in-init", in_init["id"], gone.pid)
    records = {r.job_id: r for r in sandboxes.ledger.list(NODE)}
    for record in records.values():  # INIT's worker dies: the entries' owner is gone
        assert sandboxes.ledger.transfer(NODE, record.sandbox_id, gone, "init@dead")

    def running(job_id: str) -> list[procfs.ProcInfo]:
        record = records[job_id]
        return procfs.members(record.root, record.pidns, record.refs)
    assert sandboxes.reap() == 1 and [r.job_id for r in sandboxes.ledger.list(NODE)] == ["handed"]
    assert procfs.wait_until(lambda: not running("in-init"), 10) and not os.path.exists(in_init["workspace"])
    assert sandboxes.reap() == 0 and len(running("handed")) >= 2  # kept, tick after tick

    async def adopt_and_use() -> str:  # what RUN does with it
        sandboxes.adopt(handed)
        async with tool_client(handed) as tools:
            assert tools is not None
            return (await tools.bash("echo alive")).output
    assert "alive" in asyncio.run(adopt_and_use())
    assert sandboxes.ledger.get(NODE, handed["id"]).owner == ProcessRef.of(os.getpid())
    asyncio.run(sandboxes.stop(handed))
    assert procfs.wait_until(lambda: not running("handed"), 10)
    assert sandboxes.ledger.list(NODE) == [] and sandboxes.allocator.leases() == {}
