"""The reaper's indexes against a real redis-server: the lease index and the RUN-queue lists move
with every transition, a tick's Redis work does not grow with the number of active jobs, and
jobs written without the indexes (an older version) are still reaped."""
from __future__ import annotations

import time

import pytest
import redis

from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state import keys, leases
from prorl_celery.state import store as store_module
from prorl_celery.state.leases import LeaseKeeper, Reaper, backfill, index_drift
from prorl_celery.state.store import JobStore
from tests.support.services import flushed_client, own_redis_fixture

LEASE_S = 1.0


own_redis = own_redis_fixture("redis-leases")


@pytest.fixture
def client(own_redis):
    with flushed_client(own_redis) as connection:
        yield connection


def make_store(client: redis.Redis) -> JobStore:
    return JobStore(client, result_ttl_s=60, lease_s=LEASE_S)


def workers(client: redis.Redis) -> None:
    """One live RUN worker on node "live", one on node "dead" whose heartbeats stopped."""
    now = time.time()
    for name, node, beat in (("run-live@h", "live", now), ("run-dead@h", "dead", now - 60)):
        client.zadd(keys.WORKERS, {name: beat})
        client.hset(keys.worker(name), mapping={"node": node, "queues": f"run,run.{node}"})


def waiting_for_run(store: JobStore, job_id: str, node: str) -> None:
    assert store.claim_stage(job_id, Stage.INIT, {"init_node": node}).ok
    assert store.hand_over(job_id, Stage.INIT, {"run_queue": f"run.{node}"}, attempt=1).ok


def commands_of(client: redis.Redis, action) -> tuple[int, dict[str, int]]:
    """Redis commands ``action`` makes the server run, those run inside scripts included."""
    client.config_resetstat()
    result = action()
    stats = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in client.info("commandstats").items()}
    stats = {name: calls for name, calls in stats.items() if name not in {"config|resetstat", "config", "info"}}
    return result, stats


def test_indexes_follow_the_job_through_its_stages(client):
    store = make_store(client)
    store.create("j", {"task": "noop", "instance": {}, "budget_s": 10, "attempt": 1, "max_attempts": 2})
    assert client.zcard(keys.LEASES) == 0
    claimed_at = store.server_time()
    assert store.claim_stage("j", Stage.INIT, {"init_node": "n1"}).ok
    assert client.zscore(keys.LEASES, "j") == pytest.approx(claimed_at + LEASE_S, abs=0.5)
    keeper = LeaseKeeper(client, lease_s=100)
    keeper.hold("j")
    keeper.close()
    assert keeper.renew_now() == 1
    assert client.zscore(keys.LEASES, "j") == pytest.approx(float(client.hget(keys.job("j"), "lease_until")))
    assert client.zscore(keys.LEASES, "j") > claimed_at + 90
    assert store.hand_over("j", Stage.INIT, {"run_queue": "run.n1"}, attempt=1).ok
    assert client.zcard(keys.LEASES) == 0 and keeper.renew_now() == 0  # a renewal never re-adds it
    assert client.smembers(keys.waiting_run("run.n1")) == {"j"}
    assert client.hgetall(keys.WAITING_RUN_QUEUES) == {"run.n1": "n1"}
    assert index_drift(store) == (0, 0)
    # retried from INIT (its node died): off the node's list, whose entry goes with its last job
    assert store.transition("j", JobStatus.PENDING_INIT, only_from=JobStatus.PENDING_RUN, attempt=1,
                            fields={**store_module.RETRY_RESET, "attempt": 2}).ok
    assert not client.exists(keys.waiting_run("run.n1")) and client.hgetall(keys.WAITING_RUN_QUEUES) == {}
    assert store.claim_stage("j", Stage.INIT).ok
    assert store.hand_over("j", Stage.INIT, {"run_queue": ""}, attempt=2).ok  # the shared queue: no node
    # listed in its set, never among the node queues (no node to lose, nothing for the reaper)
    assert client.hgetall(keys.WAITING_RUN_QUEUES) == {} and client.smembers(keys.waiting_run("run")) == {"j"}
    assert index_drift(store) == (0, 0)
    assert store.claim_stage("j", Stage.RUN).ok
    assert not client.exists(keys.waiting_run("run")) and client.zscore(keys.LEASES, "j") is not None
    assert index_drift(store) == (0, 0)
    assert store.cancel("j").ok
    assert client.zcard(keys.LEASES) == 0 and index_drift(store) == (0, 0)


FIELDS = {"task": "noop", "instance": {}, "budget_s": 100, "attempt": 1, "max_attempts": 1}


def populate(store: JobStore, active: int) -> None:
    """``active`` jobs (created pipelined): 15 % executing INIT, their leases renewed far ahead
    (their workers live), 5 % waiting in a live node's RUN queue, the rest waiting for INIT."""
    client = store.redis
    workers(client)
    ids = [f"job-{i}" for i in range(active)]
    for start in range(0, active, 2000):
        store.create_many([(job_id, FIELDS) for job_id in ids[start:start + 2000]])
    executing, waiting = ids[: active * 15 // 100], ids[active * 15 // 100: active * 20 // 100]
    for job_id in executing:
        assert store.claim_stage(job_id, Stage.INIT, {"init_node": "live"}).ok
    keeper = LeaseKeeper(client, lease_s=600)
    for job_id in executing:
        keeper.hold(job_id)
    keeper.close()
    assert keeper.renew_now() == len(executing)
    for job_id in waiting:
        waiting_for_run(store, job_id, "live")
    assert client.scard(keys.ACTIVE_JOBS) == active and client.zcard(keys.LEASES) == len(executing)


def one_tick(client: redis.Redis, active: int) -> dict[str, int]:
    """Commands of one reaper tick among ``active`` jobs that finds one job whose lease ran out
    and one stranded in a dead node's RUN queue."""
    client.flushall()
    store = make_store(client)
    populate(store, active)
    reaper = Reaper(store, "reaper-1", lease_s=LEASE_S, interval_s=5, retry=lambda job_id: None, heartbeat_s=1)
    workers(client)  # beats again: populating may take longer than a heartbeat's 6 s of grace
    assert reaper.tick() == []  # takes the lock, so backfills once (nothing to add), reaps nothing
    store.create_many([("lost", FIELDS), ("stranded", FIELDS)])
    assert store.claim_stage("lost", Stage.INIT).ok  # and its worker dies: no renewal
    waiting_for_run(store, "stranded", "dead")
    time.sleep(max(0.0, float(client.zscore(keys.LEASES, "lost")) - store.server_time()) + 0.05)
    workers(client)
    reaped, stats = commands_of(client, reaper.tick)
    assert sorted(reaped) == ["lost", "stranded"]
    lost, stranded = store.load("lost"), store.load("stranded")
    assert lost.status is JobStatus.FAILED and "lease expired" in (lost.error or ""), lost
    assert stranded.status is JobStatus.FAILED and "node lost" in (stranded.error or ""), stranded
    print(f"{active} active jobs: one tick ran {sum(stats.values())} Redis commands {dict(sorted(stats.items()))}")
    return stats


def test_one_reaper_tick_costs_the_same_for_100_and_10000_active_jobs(client):
    few, many = one_tick(client, 100), one_tick(client, 10_000)
    assert few == many
    # the records read are those of the jobs reaped, never one per active job
    assert many.get("hmget", 0) <= 6 and sum(many.values()) < 80, many


def test_jobs_written_without_the_indexes_are_reaped(client, monkeypatch):
    """An upgrade: records an older version wrote carry no index entries; the reaper indexes them
    when it takes the lock, and again when the counters show an older worker claimed since."""
    store = make_store(client)
    workers(client)
    store.create_many([(job_id, FIELDS) for job_id in ("old-lost", "old-stranded", "old-queued", "later")])
    assert store.claim_stage("old-lost", Stage.INIT).ok
    waiting_for_run(store, "old-stranded", "dead")
    waiting_for_run(store, "old-queued", "live")
    client.delete(keys.LEASES, keys.WAITING_RUN_QUEUES, keys.waiting_run("run.dead"), keys.waiting_run("run.live"))
    assert index_drift(store) == (1, 2)
    time.sleep(LEASE_S + 0.1)
    reaper = Reaper(store, "reaper-new", lease_s=LEASE_S, interval_s=5, heartbeat_s=1)
    assert sorted(reaper.tick()) == ["old-lost", "old-stranded"]
    assert client.smembers(keys.waiting_run("run.live")) == {"old-queued"} and index_drift(store) == (0, 0)
    # an older worker, still running beside the new reaper, claims a job and dies
    assert store.claim_stage("later", Stage.INIT).ok
    client.zrem(keys.LEASES, "later")
    time.sleep(LEASE_S + 0.1)
    monkeypatch.setattr(leases, "BACKFILL_MIN_INTERVAL_S", 0.0)
    assert reaper.tick() == ["later"]
    assert index_drift(store) == (0, 0) and backfill(store, LEASE_S) == 0


def test_stale_entries_are_dropped_not_reaped(client):
    """An entry whose job has left its status (an older version moved it) is taken out of the
    index by the reaper, never given up."""
    store = make_store(client)
    workers(client)
    store.create_many([("a", FIELDS), ("b", FIELDS)])
    assert store.claim_stage("a", Stage.INIT).ok
    waiting_for_run(store, "b", "dead")
    client.hset(keys.job("a"), "status", "pending_run")  # as an older transition script would leave it
    client.hset(keys.job("b"), "status", "run")
    time.sleep(LEASE_S + 0.1)
    assert leases.reap_expired(store, LEASE_S, heartbeat_s=1) == []
    assert client.zscore(keys.LEASES, "a") is None and not client.sismember(keys.waiting_run("run.dead"), "b")


def test_a_reaper_with_a_longer_lease_waits_for_its_own(client):
    """The record decides, as before the index: a claim that took a 1 s lease is reaped by a
    reaper whose lease is 3 s only after 3 s; meanwhile its entry is moved to that deadline."""
    store = make_store(client)
    store.create("j", FIELDS)
    assert store.claim_stage("j", Stage.INIT).ok
    claimed_at = float(client.hget(keys.job("j"), "status_at"))
    time.sleep(LEASE_S + 0.1)
    assert leases.expired_jobs(store, lease_s=3.0) == []
    assert client.zscore(keys.LEASES, "j") == pytest.approx(claimed_at + 3.0, abs=1e-3)
    time.sleep(max(0.0, claimed_at + 3.0 - store.server_time()) + 0.05)
    assert leases.expired_jobs(store, lease_s=3.0) == [("j", Stage.INIT)]


def a_job_through_its_stages(store: JobStore, job_id: str) -> None:
    """create, then claim and hand over (or finish) each stage, as the gateway and stages do."""
    store.create(job_id, FIELDS)
    for stage in Stage:
        assert store.claim_stage(job_id, stage, {"node": "n1", f"{stage.value}_node": "n1"}).ok
        if stage.next is not None:
            assert store.hand_over(job_id, stage, {f"{stage.value}_result": {}, "run_queue": ""}, attempt=1).ok
    assert store.finish(job_id, JobStatus.COMPLETED, {"reward": 1.0}, attempt=1).ok


def test_a_job_s_bookkeeping_commands(client):
    """Every Redis command a job's own bookkeeping costs (its scripts' inner commands counted),
    pinned: a command more per job is a command more for every job of a busy cluster."""
    store = make_store(client)
    a_job_through_its_stages(store, "warm")  # the scripts are loaded once per server
    _, stats = commands_of(client, lambda: a_job_through_its_stages(store, "j"))
    print(f"one job's bookkeeping: {sum(stats.values())} Redis commands {dict(sorted(stats.items()))}")
    assert stats.pop("zremrangebyrank", 0) <= 1  # one creation in 64 trims the recent-jobs listing
    # the minute's counters get their TTL from the minute's first job: "warm", unless a minute began
    new_minute = int(store.load("warm").ended_at or 0) // 60 != int(store.load("j").ended_at or 0) // 60
    # create 8, each claim 7, each hand-over 7, the finish 14 (EVALSHAs included; its outcome
    # counted twice: keys.OUTCOME_COUNTS and the minute's), the shared RUN queue's set 2 (in and
    # out), and the index of jobs waiting for INIT and EVAL 4 (in and out of each: keys.unclaimed)
    assert stats == {"evalsha": 7, "time": 7, "hset": 7, "hincrby": 16, "hmget": 3, "hgetall": 3, "zadd": 6,
                     "zrem": 5, "sadd": 2, "srem": 2, "hget": 1, "get": 1, "xadd": 1, "hincrbyfloat": 1,
                     "expire": 3 + new_minute}, stats
    assert sum(stats.values()) == 65 + new_minute  # 65 before the claims' HMGETs, the shared queue's
    # node-queue bookkeeping, the per-job minute TTL and trim were folded or dropped (63); the end's
    # two EXPIREs of the job's journal and its meta (state/journal.py: they expire with the job,
    # and cost nothing when the job kept none) made it 65 again
