"""The cancel watcher against a real redis-server: a published cancel wakes the stage at once, one
published before the listener subscribed is found right after it subscribes, one whose message
was lost is found by the sweep, and a sweep costs one command however many stages are watched."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis

from prorl_celery.core.status import JobStatus
from prorl_celery.state.cancellation import CancelWatcher
from prorl_celery.state.store import JobStore
from tests.support.services import own_redis_fixture

own_redis = own_redis_fixture("redis-cancel")


@pytest.fixture
def store(own_redis):
    client = redis.Redis.from_url(own_redis, decode_responses=True)
    client.flushall()
    yield JobStore(client, result_ttl_s=60)
    client.flushall()


def new_jobs(store: JobStore, *job_ids: str) -> None:
    store.create_many([(job_id, {"task": "noop", "budget_s": 60}) for job_id in job_ids])


def watching(watcher: CancelWatcher, job_id: str, within_s: float, before=lambda: None) -> float | None:
    """Seconds until ``job_id``'s event is set (None: not within ``within_s``); ``before()`` runs
    once the watch is registered."""
    async def main() -> float | None:
        event = watcher.watch(job_id, asyncio.get_running_loop())
        started = time.monotonic()
        before()
        try:
            await asyncio.wait_for(event.wait(), within_s)
        except TimeoutError:
            return None
        finally:
            watcher.unwatch(job_id, event)
        return time.monotonic() - started
    return asyncio.run(main())


def test_a_published_cancel_wakes_the_stage_at_once(store):
    watcher = CancelWatcher(store.redis, sweep_s=30)
    try:
        new_jobs(store, "warm", "j")
        assert watching(watcher, "warm", 0.5) is None  # the listener is up and subscribed
        # far within the 30 s sweep: the message did it
        woke = watching(watcher, "j", 5, before=lambda: store.cancel("j"))
        assert woke is not None and woke < 2
    finally:
        watcher.close()


def test_a_cancel_before_the_listener_subscribed_is_found_when_it_subscribes(store):
    new_jobs(store, "j")
    assert store.cancel("j").ok  # published to nobody
    watcher = CancelWatcher(store.redis, sweep_s=30)  # its first watch starts the listener
    try:
        woke = watching(watcher, "j", 5)
        assert woke is not None and woke < 2
    finally:
        watcher.close()


def test_a_lost_message_is_found_by_the_sweep_in_one_command(store):
    watcher = CancelWatcher(store.redis, sweep_s=30)
    try:
        ids = [f"j{i}" for i in range(200)]
        new_jobs(store, "warm", *ids)
        assert watching(watcher, "warm", 0.5) is None  # subscribed, and its first sweep done
        loop = asyncio.new_event_loop()
        events = {job_id: watcher.watch(job_id, loop) for job_id in ids}
        store.redis.config_resetstat()
        watcher._sweep()  # 200 running stages, none cancelled
        stats = {name: int(row["calls"]) for name, row in store.redis.info("commandstats").items()}
        assert stats.get("cmdstat_smismember") == 1 and "cmdstat_hget" not in stats, stats
        # cancelled without the message (as if published while the listener reconnected)
        assert store.finish("j7", JobStatus.CANCELLED).ok
        assert store.finish("j8", JobStatus.FAILED).ok  # ended otherwise: its stage is not woken
        store.redis.config_resetstat()
        watcher._sweep()
        stats = {name: int(row["calls"]) for name, row in store.redis.info("commandstats").items()}
        assert stats.get("cmdstat_smismember") == 1 and stats.get("cmdstat_hget") == 2, stats
        loop.run_until_complete(asyncio.sleep(0))  # the wake-ups are scheduled on the stages' loop
        assert {job_id for job_id, event in events.items() if event.is_set()} == {"j7"}
        loop.close()
    finally:
        watcher.close()
