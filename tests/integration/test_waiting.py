"""Waiting on jobs: one listener per process wakes every waiter, none holds a Redis connection,
no ending is missed (ended before the wait, during it, or outside the stream)."""
from __future__ import annotations

import threading
import time

import pytest

from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys
from prorl_celery.state.connection import get_redis
from prorl_celery.state.store import JobStore
from prorl_celery.state.waiting import CompletionWaiter
from tests.support.services import flushed_store


@pytest.fixture
def store(redis_url: str):
    with flushed_store(redis_url + "/5") as store:
        yield store


def new_job(store: JobStore, job_id: str) -> None:
    store.create(job_id, {"task": "noop", "budget_s": 60})


def test_ended_before_and_during_the_wait(store: JobStore) -> None:
    new_job(store, "before")
    assert store.finish("before", JobStatus.CANCELLED).ok
    assert store.wait("before", 5) is JobStatus.CANCELLED
    new_job(store, "during")
    threading.Timer(0.3, lambda: store.finish("during", JobStatus.CANCELLED)).start()
    started = time.monotonic()
    assert store.wait("during", 10, exists=True) is JobStatus.CANCELLED
    assert time.monotonic() - started < 2.0
    new_job(store, "slow")
    assert store.wait("slow", 0.3) is JobStatus.PENDING_INIT  # the timeout returns the status then


def test_many_waiters_share_one_connection(store: JobStore) -> None:
    ids = [f"job{i}" for i in range(300)]
    for job_id in ids:
        new_job(store, job_id)
    def blocked() -> list[dict]:
        return [c for c in store.redis.client_list() if "b" in c.get("flags", "")]
    store.waiter.wait("job0", 0.01, lambda: store.status("job0"))  # the listener is up
    before = len(blocked())
    results: dict[str, JobStatus] = {}
    threads = [threading.Thread(target=lambda j=j: results.__setitem__(j, store.wait(j, 30))) for j in ids]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while store.waiter.waiting() < len(ids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.waiter.waiting() == len(ids)
    assert len(blocked()) <= before, blocked()  # the listener's one XREAD, not one per waiter
    for job_id in ids:
        assert store.finish(job_id, JobStatus.CANCELLED).ok
    for thread in threads:
        thread.join(10)
    assert results == {j: JobStatus.CANCELLED for j in ids}
    assert store.waiter.waiting() == 0


def test_an_ending_outside_the_stream_is_found_by_the_sweep(store: JobStore) -> None:
    waiter = CompletionWaiter(store.redis, sweep_s=0.3)
    new_job(store, "quiet")
    threading.Timer(0.2, lambda: store.redis.hset(keys.job("quiet"), "status", "cancelled")).start()
    started = time.monotonic()
    assert waiter.wait("quiet", 10, lambda: store.status("quiet")) is JobStatus.CANCELLED
    assert time.monotonic() - started < 3.0
    waiter.close()


def test_a_wait_registered_before_the_job_exists_reads_no_status(store: JobStore) -> None:
    """/process registers before it creates the job: an ending right after creation (before the
    wait starts) still wakes it, and the only read is the listener's."""
    reads: list[str] = []

    def read_status() -> JobStatus | None:
        reads.append("status")
        return store.status("quick")

    registered = store.waiter.register("quick")
    new_job(store, "quick")
    assert store.finish("quick", JobStatus.CANCELLED).ok  # ended before wait() is even called
    started = time.monotonic()
    assert store.waiter.wait("quick", 10, read_status, registered=registered) is JobStatus.CANCELLED
    assert time.monotonic() - started < 2.0 and reads == []
    assert store.waiter.waiting() == 0
    dropped = store.waiter.register("never-created")
    store.waiter.unregister("never-created", dropped)
    assert store.waiter.waiting() == 0


def test_a_waiter_nobody_closed_stops_its_listener_once_collected(redis_url: str) -> None:
    """A test's store that is never closed must not keep a listener that outlives its Redis."""
    import gc

    # the service's own client (a blocking pool of 1024): a plain pool caps at 100 connections, and
    # the 300 waiters' status reads at once then fail with "Too many connections" under load
    client = get_redis(redis_url + "/5")
    waiter = CompletionWaiter(client)
    assert waiter.wait("absent", 0.01, lambda: None) is None  # starts the listener
    thread = waiter._thread
    assert thread is not None and thread.is_alive()
    del waiter
    gc.collect()
    thread.join(10)  # within one blocking read
    assert not thread.is_alive()


def test_unknown_job(store: JobStore) -> None:
    from prorl_celery.core.errors import JobNotFound

    with pytest.raises(JobNotFound):
        store.wait("nope", 1)


def test_gunicorn_config_loads_nothing_of_the_service() -> None:
    """gunicorn's master imports the config before the gevent worker monkey-patches: a service
    module imported there would keep unpatched locks that freeze a worker's greenlets."""
    import subprocess
    import sys

    code = ("import sys, api.gunicorn_conf\n"
            "print(','.join(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'prorl_celery', 'redis', 'celery', 'kombu', 'flask'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
    assert subprocess.run([sys.executable, "-c", "import gunicorn.config; import api.gunicorn_conf as c; "
                           "assert c.worker_class in ('gevent', 'gthread')"], timeout=60).returncode == 0


def test_the_listener_reads_on_after_its_connection_is_killed(redis_url: str) -> None:
    """The listener holds one connection from read to read: killed under it (a proxy's idle
    timeout, ``CLIENT KILL``), the next read takes a new one and no ending is missed."""
    client = get_redis(redis_url + "/8")  # a db of its own: other tests' listeners read elsewhere
    client.flushdb()
    store = JobStore(client, result_ttl_s=60)
    try:
        new_job(store, "survivor")
        registered = store.waiter.register("survivor")

        def listening() -> list[dict]:
            return [c for c in client.client_list() if c.get("cmd") == "xread" and c.get("db") == "8"]
        deadline = time.monotonic() + 10
        while not listening() and time.monotonic() < deadline:
            time.sleep(0.01)
        (before,) = listening()
        client.client_kill_filter(_id=before["id"])
        assert store.finish("survivor", JobStatus.CANCELLED).ok
        started = time.monotonic()
        assert store.waiter.wait("survivor", 20, lambda: store.status("survivor"), registered=registered) \
            is JobStatus.CANCELLED
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while not listening() and time.monotonic() < deadline:
            time.sleep(0.01)
        (after,) = listening()  # one listener connection again, a new one
        assert after["id"] != before["id"]
    finally:
        store.waiter.close()
