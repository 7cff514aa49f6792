"""Waits answered with the job's record (``/process``, ``GET /jobs/<id>?wait=``): the completion
listener reads the hashes of the jobs one stream read names in one round trip on its own
connection before it wakes their waits, so a woken request reads nothing itself; without that
read (it failed, or the wake came from the sweep) the request reads its own, and no ending is
missed."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys, waiting
from prorl_celery.state.store import JobRecord, JobStore, decode_record
from tests.support.services import flushed_store


@pytest.fixture
def store(redis_url: str):
    with flushed_store(redis_url + "/6") as store:
        yield store


class Reads:
    """A request's own record reads, counted (the ids of each)."""

    def __init__(self, store: JobStore) -> None:
        self.store, self.calls = store, []

    def __call__(self, job_ids: list[str]) -> list[JobRecord | None]:
        self.calls.append(list(job_ids))
        return self.store.load_many(job_ids)


@pytest.fixture
def listener(monkeypatch) -> list[list[str]]:
    """The keys of every read the completion listener makes for the waits it wakes."""
    reads: list[list[str]] = []
    read_hashes = waiting._Listening.read_hashes

    def counted(state: waiting._Listening, keys_: list[str]) -> list[dict[str, str]]:
        reads.append([key.rsplit(":", 1)[-1] for key in keys_])
        return read_hashes(state, keys_)
    monkeypatch.setattr(waiting._Listening, "read_hashes", counted)
    return reads


def new_job(store: JobStore, job_id: str) -> None:
    store.create(job_id, {"task": "noop", "budget_s": 60})


def test_a_wait_registered_before_the_job_exists_is_answered_by_the_listeners_read(store: JobStore, listener) -> None:
    own = Reads(store)
    registered = store.waiter.register_record("quick", decode_record)
    new_job(store, "quick")
    assert store.finish("quick", JobStatus.FAILED, {"error": "quick"}).ok
    record = store.waiter.wait_record("quick", 10, own, decode_record, registered=registered)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "quick"
    assert listener == [["quick"]] and own.calls == []
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
def test_jobs_named_by_one_stream_read_are_read_together(store: JobStore, listener, monkeypatch, record_slice,
                                                        reads) -> None:
    monkeypatch.setattr(waiting, "RECORD_SLICE", record_slice)
    own = Reads(store)
    ids = [f"batch{i}" for i in range(5)]
    registered = {job_id: store.waiter.register_record(job_id, decode_record) for job_id in ids}
    for job_id in ids:
        new_job(store, job_id)
    records: dict[str, JobRecord | None] = {}
    threads = [threading.Thread(target=lambda j=j: records.__setitem__(
        j, store.waiter.wait_record(j, 10, own, decode_record, registered=registered[j]))) for j in ids]
    for thread in threads:
        thread.start()
    assert store.waiter.waiting() == 5  # registered: an ending from now on wakes each
    end_in_one_read(store, ids)
    for thread in threads:
        thread.join(10)
    assert {j: r.status if r else None for j, r in records.items()} == dict.fromkeys(ids, JobStatus.CANCELLED)
    assert [len(call) for call in listener] == reads and sorted(sum(listener, [])) == ids
    assert own.calls == []


def test_a_failed_listener_read_leaves_each_request_to_read_its_own(store: JobStore, monkeypatch) -> None:
    def lost(state: waiting._Listening, keys_: list[str]) -> list[dict[str, str]]:
        raise redis.ConnectionError("Redis went away")
    monkeypatch.setattr(waiting._Listening, "read_hashes", lost)
    own = Reads(store)
    registered = store.waiter.register_record("unlucky", decode_record)
    new_job(store, "unlucky")
    assert store.finish("unlucky", JobStatus.FAILED, {"error": "boom"}).ok
    record = store.waiter.wait_record("unlucky", 10, own, decode_record, registered=registered)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "boom"
    assert own.calls == [["unlucky"]]
    assert store.waiter.waiting() == 0


def test_a_record_the_listener_cannot_decode_is_read_by_its_request(store: JobStore) -> None:
    def broken(raw: dict[str, str]) -> JobRecord:
        raise ValueError("not a record")
    own = Reads(store)
    registered = store.waiter.register_record("odd", broken)
    new_job(store, "odd")
    assert store.finish("odd", JobStatus.CANCELLED).ok
    record = store.waiter.wait_record("odd", 10, own, broken, registered=registered)
    assert record is not None and record.status is JobStatus.CANCELLED
    assert own.calls == [["odd"]]


def test_without_a_registration_the_record_is_read_once_after_registering(store: JobStore, listener) -> None:
    own = Reads(store)
    new_job(store, "done")
    assert store.finish("done", JobStatus.CANCELLED).ok
    record = store.waiter.wait_record("done", 10, own, decode_record)  # ended before the call
    assert record is not None and record.status is JobStatus.CANCELLED
    assert own.calls == [["done"]] and listener == [] and store.waiter.waiting() == 0
    assert store.waiter.wait_record("nobody", 10, own, decode_record) is None
    assert store.waiter.wait_record("nobody", 0, own, decode_record) is None  # no wait: one read, no registration
    assert store.waiter.waiting() == 0


def test_a_job_ending_during_the_wait_is_answered_by_the_listener(store: JobStore, listener) -> None:
    own = Reads(store)
    new_job(store, "later")
    threading.Timer(0.3, lambda: store.finish("later", JobStatus.FAILED, {"error": "later"})).start()
    started = time.monotonic()
    record = store.waiter.wait_record("later", 10, own, decode_record)
    assert record is not None and record.status is JobStatus.FAILED and record.error == "later"
    assert time.monotonic() - started < 5
    assert own.calls == [["later"]] and listener == [["later"]]  # the first read, then the listener's


def test_at_the_timeout_the_record_is_as_it_is_then(store: JobStore) -> None:
    own = Reads(store)
    new_job(store, "slow")
    record = store.waiter.wait_record("slow", 0.3, own, decode_record)
    assert record is not None and record.status is JobStatus.PENDING_INIT
    assert store.waiter.waiting() == 0
