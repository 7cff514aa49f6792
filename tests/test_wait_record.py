"""Waits answered with the job's record (``/process``, ``GET /jobs/<id>?wait=``): the completion
listener reads the records of the jobs one stream read names in one round trip before it wakes
their waits, so a woken request reads nothing itself; without that read (it failed, or the wake
came from the sweep) the request reads its own, and no ending is missed."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from prorl_celery import keys, waiting
from prorl_celery.connection import get_redis
from prorl_celery.status import JobStatus
from prorl_celery.store import JobRecord, JobStore


@pytest.fixture
def store(redis_url: str):
    client = get_redis(redis_url + "/6")
    client.flushdb()
    store = JobStore(client, result_ttl_s=60)
    yield store
    store.waiter.close()


class Reads:
    """A record loader that counts its calls (the ids of each)."""

    def __init__(self, store: JobStore, fail: bool = False) -> None:
        self.store, self.fail, self.calls = store, fail, []

    def __call__(self, job_ids: list[str]) -> list[JobRecord | None]:
        self.calls.append(list(job_ids))
        if self.fail:
            raise redis.ConnectionError("Redis went away")
        return self.store.load_many(job_ids)


def new_job(store: JobStore, job_id: str) -> None:
    store.create(job_id, {"task": "noop", "budget_s": 60})


def test_a_wait_registered_before_the_job_exists_is_answered_by_the_listeners_read(store: JobStore) -> None:
    listener, own = Reads(store), Reads(store)
    registered = store.waiter.register_record("quick", listener)
    new_job(store, "quick")
    assert store.finish("quick", JobStatus.FAILED, {"error": "quick"}).ok
    record = store.waiter.wait_record("quick", 10, listener, read=own, registered=registered)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "quick"
    assert listener.calls == [["quick"]] and own.calls == []
    assert store.waiter.waiting() == 0


def end_in_one_read(store: JobStore, job_ids: list[str]) -> None:
    """End every job in one transaction (status and stream entry, as transition.lua writes them):
    the listener's next read names them together."""
    pipe = store.redis.pipeline(transaction=True)
    for job_id in job_ids:
        pipe.hset(keys.job(job_id), "status", JobStatus.CANCELLED.value)
        pipe.xadd(keys.JOBS_ENDED, {"job": job_id, "status": JobStatus.CANCELLED.value})
    pipe.execute()


@pytest.mark.parametrize("record_slice, reads", [(500, [5]), (2, [2, 2, 1])])
def test_jobs_named_by_one_stream_read_are_read_together(store: JobStore, monkeypatch, record_slice, reads) -> None:
    monkeypatch.setattr(waiting, "RECORD_SLICE", record_slice)
    listener, own = Reads(store), Reads(store)
    ids = [f"batch{i}" for i in range(5)]
    registered = {job_id: store.waiter.register_record(job_id, listener) for job_id in ids}
    for job_id in ids:
        new_job(store, job_id)
    records: dict[str, JobRecord | None] = {}
    threads = [threading.Thread(target=lambda j=j: records.__setitem__(
        j, store.waiter.wait_record(j, 10, listener, read=own, registered=registered[j]))) for j in ids]
    for thread in threads:
        thread.start()
    assert store.waiter.waiting() == 5  # registered: an ending from now on wakes each
    end_in_one_read(store, ids)
    for thread in threads:
        thread.join(10)
    assert {j: r.status if r else None for j, r in records.items()} == dict.fromkeys(ids, JobStatus.CANCELLED)
    assert [len(call) for call in listener.calls] == reads and sorted(sum(listener.calls, [])) == ids
    assert own.calls == []


def test_a_failed_listener_read_leaves_each_request_to_read_its_own(store: JobStore) -> None:
    listener, own = Reads(store, fail=True), Reads(store)
    registered = store.waiter.register_record("unlucky", listener)
    new_job(store, "unlucky")
    assert store.finish("unlucky", JobStatus.FAILED, {"error": "boom"}).ok
    record = store.waiter.wait_record("unlucky", 10, listener, read=own, registered=registered)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "boom"
    assert listener.calls == [["unlucky"]] and own.calls == [["unlucky"]]
    assert store.waiter.waiting() == 0


def test_without_a_registration_the_record_is_read_once_after_registering(store: JobStore) -> None:
    listener, own = Reads(store), Reads(store)
    new_job(store, "done")
    assert store.finish("done", JobStatus.CANCELLED).ok
    record = store.waiter.wait_record("done", 10, listener, read=own)  # ended before the call
    assert record is not None and record.status is JobStatus.CANCELLED
    assert own.calls == [["done"]] and listener.calls == [] and store.waiter.waiting() == 0
    assert store.waiter.wait_record("nobody", 10, listener, read=own) is None
    assert store.waiter.wait_record("nobody", 0, listener, read=own) is None  # no wait: one read, no registration
    assert store.waiter.waiting() == 0


def test_a_job_ending_during_the_wait_is_answered_by_the_listener(store: JobStore) -> None:
    listener, own = Reads(store), Reads(store)
    new_job(store, "later")
    threading.Timer(0.3, lambda: store.finish("later", JobStatus.FAILED, {"error": "later"})).start()
    started = time.monotonic()
    record = store.waiter.wait_record("later", 10, listener, read=own)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "later"
    assert time.monotonic() - started < 5
    assert own.calls == [["later"]] and listener.calls == [["later"]]  # the first read, then the listener's


def test_at_the_timeout_the_record_is_as_it_is_then(store: JobStore) -> None:
    listener, own = Reads(store), Reads(store)
    new_job(store, "slow")
    record = store.waiter.wait_record("slow", 0.3, listener, read=own)
    assert record is not None and record.status is JobStatus.PENDING_INIT
    assert store.waiter.waiting() == 0
