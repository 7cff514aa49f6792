"""The gateway's cheaper paths keep their meaning: the completion listener's raw stream reads
(RESP2 and RESP3, other processes' jobs in the same reply, fields in any order) and redis-py's
zero-timeout readiness check through the OS poll under gevent (still tells a dirty connection
from a clean one, and a wait with a timeout still yields to other greenlets)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis

from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys
from prorl_celery.state.store import JobStore, decode_record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def store(redis_url: str, request: pytest.FixtureRequest):
    client = redis.Redis.from_url(redis_url + "/7", decode_responses=True, protocol=request.param,
                                  socket_timeout=30)
    client.flushdb()
    store = JobStore(client, result_ttl_s=60)
    yield store
    store.waiter.close()


def test_listener_wakes_its_own_job_among_many_others(store: JobStore) -> None:
    others = [f"other{i}" for i in range(200)]
    for job_id in [*others, "mine"]:
        store.create(job_id, {"task": "noop", "budget_s": 60})
    registered = store.waiter.register("mine")

    def end_all() -> None:
        for job_id in others[:100]:
            store.finish(job_id, JobStatus.COMPLETED)
        store.finish("mine", JobStatus.CANCELLED)
        for job_id in others[100:]:
            store.finish(job_id, JobStatus.FAILED)
    threading.Timer(0.2, end_all).start()
    reads: list[str] = []

    def read_status() -> JobStatus | None:
        reads.append("mine")
        return None
    started = time.monotonic()
    # the status comes from the stream entry: the read_status given is never called
    status = store.waiter.wait("mine", 10, read_status, registered=registered)
    assert status is JobStatus.CANCELLED
    assert reads == []
    assert time.monotonic() - started < 5
    assert store.waiter.waiting() == 0


def test_listener_reads_the_records_it_wakes_with_in_either_protocol(store: JobStore) -> None:
    registered = store.waiter.register_record("mine", decode_record)
    store.create("mine", {"task": "noop", "budget_s": 60, "instance": {"instance_id": "i-7"}})
    assert store.finish("mine", JobStatus.FAILED, {"error": "on purpose"}).ok

    def read(job_ids: list[str]) -> list:
        raise AssertionError("the listener's read answers")
    record = store.waiter.wait_record("mine", 10, read, decode_record, registered=registered)
    assert record == store.load("mine")  # RESP3's map and RESP2's flat list decode alike
    assert record.error == "on purpose" and record.instance == {"instance_id": "i-7"}


def test_listener_reads_fields_in_any_order(store: JobStore) -> None:
    registered = store.waiter.register("odd")
    store.redis.xadd(keys.JOBS_ENDED, {"status": "failed", "job": "odd"})
    assert store.waiter.wait("odd", 10, lambda: None, registered=registered) is JobStatus.FAILED


GEVENT_CHECK = """
from gevent import monkey
monkey.patch_all()
import sys, time
import gevent, redis
from redis._parsers import hiredis
from api import gevent_redis

url = sys.argv[1]
assert gevent_redis.install()
assert gevent_redis.install()  # twice: still one wrapper
assert hiredis._socket_can_read.os_poll_for_zero_timeout
client = redis.Redis.from_url(url, decode_responses=True, single_connection_client=False)
client.set("fast-paths", "value")
# the pool's readiness check still tells a clean connection from one holding an unread reply
connection = client.connection_pool.get_connection()
assert connection.can_read() is False
connection.send_command("PING")
time.sleep(0.1)
assert connection.can_read() is True
assert connection.read_response() == "PONG"
assert connection.can_read() is False
client.connection_pool.release(connection)
assert client.get("fast-paths") == "value"
# a non-zero timeout still waits cooperatively: another greenlet runs meanwhile
pubsub = client.pubsub()
pubsub.subscribe("fast-paths-channel")
assert pubsub.get_message(timeout=1)["type"] == "subscribe"
ticks = []
ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.02)) for _ in range(10)])
started = time.monotonic()
assert pubsub.get_message(timeout=0.5) is None
assert time.monotonic() - started >= 0.4
ticker.join()
assert len(ticks) == 10
print("ok")
"""


def test_os_poll_under_gevent_keeps_the_stale_connection_check(redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(GEVENT_CHECK), redis_url + "/7"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_without_gevent_nothing_is_patched() -> None:
    from redis._parsers import hiredis

    from api import gevent_redis
    before = hiredis._socket_can_read
    assert gevent_redis.install() is False
    assert hiredis._socket_can_read is before
