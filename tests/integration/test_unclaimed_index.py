"""The index of jobs waiting for INIT and EVAL (``keys.unclaimed``), against a real redis-server:
it follows the status through create, claims, cancel and a retry from INIT, the backfill mends
it and the drift check sees it; and ``leases.lost_messages`` tells a lost message from one that
waits behind a backlog by the real stage messages ``celery_app`` publishes."""
from __future__ import annotations

import json
import time

import pytest
import redis
from kombu.transport import redis as kombu_redis

from prorl_celery.celery_app import create_celery, enqueue, enqueue_many
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state import keys, leases
from prorl_celery.state.leases import backfill, give_up, index_drifts, lost_messages, republish_lost
from prorl_celery.state.store import SENT_HEADER, JobStore
from tests.support.services import flushed_client, own_redis_fixture

own_redis = own_redis_fixture("redis-unclaimed")
FIELDS = {"task": "noop", "instance": {}, "budget_s": 10, "attempt": 1, "max_attempts": 2}
INIT_INDEX, EVAL_INDEX = keys.unclaimed("pending_init"), keys.unclaimed("pending_eval")


@pytest.fixture
def client(own_redis):
    with flushed_client(own_redis) as connection:
        yield connection


@pytest.fixture
def celery(own_redis):
    app = create_celery(Settings(redis_url=own_redis), set_as_current=False)
    yield app
    app.close()


def make_store(client: redis.Redis) -> JobStore:
    return JobStore(client, result_ttl_s=60, lease_s=30.0)


def indexed(client: redis.Redis) -> dict[str, set[str]]:
    return {"pending_init": set(client.zrange(INIT_INDEX, 0, -1)),
            "pending_eval": set(client.zrange(EVAL_INDEX, 0, -1))}


def test_the_index_follows_the_status(client):
    store = make_store(client)
    store.create("j", FIELDS)
    created_at = float(client.hget(keys.job("j"), "created_at"))
    assert client.zscore(INIT_INDEX, "j") == pytest.approx(created_at, abs=1e-6)
    assert store.claim_stage("j", Stage.INIT).ok
    assert indexed(client) == {"pending_init": set(), "pending_eval": set()}
    assert store.hand_over("j", Stage.INIT, {"run_queue": ""}, attempt=1).ok
    assert store.claim_stage("j", Stage.RUN).ok
    assert indexed(client) == {"pending_init": set(), "pending_eval": set()}
    assert store.hand_over("j", Stage.RUN, attempt=1).ok
    entered = float(client.hget(keys.job("j"), "status_at"))
    assert client.zscore(EVAL_INDEX, "j") == pytest.approx(entered, abs=1e-6)
    assert index_drifts(store) == (0, 0, 0)
    assert store.claim_stage("j", Stage.EVAL).ok
    assert store.finish("j", JobStatus.COMPLETED, {"reward": 1.0}, attempt=1).ok
    assert indexed(client) == {"pending_init": set(), "pending_eval": set()}

    store.create("cancelled", FIELDS)
    assert store.cancel("cancelled").ok
    assert client.zcard(INIT_INDEX) == 0
    assert index_drifts(store) == (0, 0, 0)


def test_a_retry_from_init_enters_the_index_again(client):
    store = make_store(client)
    store.create("j", FIELDS)
    assert store.claim_stage("j", Stage.INIT).ok
    assert client.zcard(INIT_INDEX) == 0
    retried: list[str] = []
    assert give_up(store, "j", Stage.INIT, "worker lost", retry=retried.append)
    assert retried == ["j"] and store.status("j") is JobStatus.PENDING_INIT
    assert client.zscore(INIT_INDEX, "j") == pytest.approx(float(client.hget(keys.job("j"), "status_at")), abs=1e-6)
    assert index_drifts(store) == (0, 0, 0)


def test_backfill_and_drift(client):
    store = make_store(client)
    for job_id in ("a", "b", "c"):
        store.create(job_id, FIELDS)
    assert store.claim_stage("c", Stage.INIT).ok and store.hand_over("c", Stage.INIT, {"run_queue": ""}, attempt=1).ok
    assert store.claim_stage("c", Stage.RUN).ok and store.hand_over("c", Stage.RUN, attempt=1).ok
    scores = {job_id: client.zscore(keys.unclaimed(store.status(job_id).value), job_id) for job_id in "abc"}
    # an older version wrote these jobs without the index, and one entry is left behind by a
    # job that ended without the script (its record deleted by hand)
    client.delete(INIT_INDEX, EVAL_INDEX)
    client.zadd(INIT_INDEX, {"gone": 1.0})
    assert index_drifts(store) == (0, 0, 3 - 1)  # 3 jobs counted, 1 entry
    assert backfill(store, 30.0) == 4  # a, b and c indexed, "gone" dropped
    assert indexed(client) == {"pending_init": {"a", "b"}, "pending_eval": {"c"}}
    # scored by status_at: when the job entered its status
    assert {job_id: client.zscore(keys.unclaimed(store.status(job_id).value), job_id) for job_id in "abc"} == \
        pytest.approx(scores, abs=1e-6)
    assert index_drifts(store) == (0, 0, 0) and backfill(store, 30.0) == 0


def test_the_reaper_backfills_on_drift(client):
    store = make_store(client)
    store.create("a", FIELDS)
    reaper = leases.Reaper(store, "me", lease_s=30.0, interval_s=0.5)
    reaper.tick()  # takes the lock: the first backfill
    client.delete(INIT_INDEX)
    reaper._backfilled_at = time.monotonic() - leases.BACKFILL_MIN_INTERVAL_S - 1
    reaper.tick()
    assert indexed(client)["pending_init"] == {"a"}


def test_broker_lists_are_kombus():
    assert keys.BROKER_PRIORITY_SEP == kombu_redis.Channel.sep
    assert list(keys.BROKER_PRIORITY_STEPS) == kombu_redis.PRIORITY_STEPS


def oldest_message(client: redis.Redis, queue: str) -> dict:
    return json.loads(client.lindex(queue, -1))


def test_every_stage_message_says_when_it_was_sent(client, celery):
    before = time.time()
    enqueue(Stage.INIT, "x", celery=celery)
    enqueue_many(Stage.EVAL, ["y", "z"], batch=2, celery=celery)
    celery.conf.task_send_sent_event = True  # the send_task path (PRORL_TASK_EVENTS)
    enqueue(Stage.EVAL, "w", celery=celery)
    for raw in client.lrange("init", 0, -1) + client.lrange("eval", 0, -1):
        assert before <= json.loads(raw)["headers"][SENT_HEADER] <= time.time()
    assert client.llen("eval") == 2


def test_a_lost_message_is_found_and_a_backlog_is_not(client, celery):
    store = make_store(client)
    store.create("lost", FIELDS)  # its publisher died before publishing (or its worker after BRPOP)
    time.sleep(0.3)
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == []  # not for long enough yet
    time.sleep(0.8)
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == ["lost"]
    # re-scored as if it entered now: not found again before the bound, once published
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == []

    # a backlog: jobs whose messages are all queued, the oldest sent as the first job entered
    client.delete("init")
    backlog = [f"b{i}" for i in range(20)]
    for job_id in backlog:
        store.create(job_id, FIELDS)
        enqueue(Stage.INIT, job_id, celery=celery)
    time.sleep(1.1)
    published: list[tuple[Stage, list[str]]] = []
    assert republish_lost(store, client, lambda stage, ids: published.append((stage, ids)), after_s=1.0) == []
    assert published == [] and client.llen("init") == 20
    # ... nor with the lost job among them: it entered before the backlog's oldest was sent, but
    # by less than the margin (its message could be anywhere behind the backlog)
    client.zadd(INIT_INDEX, {"lost": store.server_time() - 5}, xx=True)
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == []
    # once the queue's oldest message was sent more than the margin after the job entered, it
    # cannot be that job's: the lost job is found, the backlog's are not
    client.zadd(INIT_INDEX, {"lost": float(oldest_message(client, "init")["headers"][SENT_HEADER]) - 61})
    assert republish_lost(store, client, lambda stage, ids: published.append((stage, ids)), after_s=1.0) == ["lost"]
    assert published == [(Stage.INIT, ["lost"])]


def test_a_message_without_the_header_stops_the_search(client):
    """A message of an older version says nothing of when it was sent: it may be older than any
    job, so none is published again until it leaves the queue."""
    store = make_store(client)
    store.create("j", FIELDS)
    client.zadd(INIT_INDEX, {"j": 1.0})
    client.lpush("init", json.dumps({"body": "", "headers": {"task": "prorl.init"}, "properties": {}}))
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == []
    client.delete("init")
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == ["j"]


def test_a_job_that_left_its_status_is_not_published(client):
    store = make_store(client)
    store.create("j", FIELDS)
    assert store.claim_stage("j", Stage.INIT).ok
    client.zadd(INIT_INDEX, {"j": 1.0})  # an entry the script did not drop (an older version's)
    assert lost_messages(store, client, Stage.INIT, after_s=1.0) == []
    assert client.zcard(INIT_INDEX) == 0  # and the stale entry is gone
