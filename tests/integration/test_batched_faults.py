"""The batched fault paths against a real redis-server, cut mid-batch by a TCP proxy.

The proxy (``tests.support.cutting_proxy``, rule ``AfterCommand``) sits between a client and the
server and reads the client's RESP commands: on the first connection that sends ``after``
commands named ``command`` it forwards those, drops everything after them and every reply
from then on, lets Redis finish what it got and closes the connection. Redis has applied
exactly those commands and the client has none of their replies: a lost reply, between two
commands the test chooses (no Redis restart, no race with the client).

1. ``JobStore.transition_many``: a pipeline of claims loses its connection after Redis applied
   some of them; each job is found out through its transition token (``_landed``).
2. ``celery_app.publish``: a batched stage publish (kombu's ``Producer.batch``, one LPUSH
   pipeline) loses its connection after some LPUSHes; the fallback sends every message again
   one by one, and a copy is a no-op by the stage claim.
"""
from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
import redis

from prorl_celery.celery_app import Message, create_celery, publish
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state.connection import get_redis
from prorl_celery.state.store import JobStore
from tests.support.cutting_proxy import AfterCommand, CuttingProxy
from tests.support.services import own_redis_fixture

own_redis = own_redis_fixture("batched-faults")


@pytest.fixture
def server(own_redis):
    """The module's redis-server, flushed: ``(url, port, client)``."""
    client = get_redis(own_redis)
    client.flushall()
    yield own_redis, int(own_redis.rsplit(":", 1)[1]), client
    client.flushall()


def new_jobs(store: JobStore, count: int) -> list[str]:
    job_ids = [f"job-{i:02d}" for i in range(count)]
    created = store.create_many([(job_id, {"task": "noop", "instance": {}, "budget_s": 10.0}) for job_id in job_ids])
    assert created == [(True, JobStatus.PENDING_INIT)] * count
    return job_ids


def test_transition_many_finds_out_per_job_which_moves_landed_after_a_lost_reply(server) -> None:
    """12 claims (``pending_init`` -> ``init``) in one pipeline whose connection is cut after
    Redis applied the first 5: all 12 report success, the 5 through their token (no previous
    status: ``_landed``), the other 7 through their resent script; Redis ran the script exactly
    12 times (none of the 5 sent again, where it would have failed as a move from ``init``),
    and every job is in ``init`` with the status counts to match (none stranded in
    ``pending_init``). Fails if a lost reply raised, was resent whole, or was taken as lost."""
    _, port, client = server
    direct = JobStore(client, result_ttl_s=60)
    job_ids = new_jobs(direct, 13)
    # the transition script in Redis's cache, as it is once a worker ran one stage: a batch is
    # sent by its SHA alone, and an uncached script would answer NOSCRIPT before the cut
    direct.claim_stage(job_ids.pop(), Stage.INIT)
    cut = AfterCommand(b"EVALSHA", after=5)
    with CuttingProxy(port, cut) as proxy:
        store = JobStore(get_redis(proxy.url("redis")), result_ttl_s=60)  # the project's client: no redis-py retries
        client.config_resetstat()
        results = store.claim_stages(job_ids, Stage.INIT)
    assert proxy.cuts == 1
    assert cut.forwarded[0] == 5  # the first connection carried the batch, cut at its 5th claim
    assert [r.ok for r in results] == [True] * 12
    assert [r.previous for r in results] == [None] * 5 + [JobStatus.PENDING_INIT] * 7
    assert [r.record.status if r.record else None for r in results] == [JobStatus.INIT] * 12
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == 12
    assert [direct.status(job_id) for job_id in job_ids] == [JobStatus.INIT] * 12
    counts = direct.status_counts()
    assert counts.get(JobStatus.INIT.value) == 13 and not counts.get(JobStatus.PENDING_INIT.value)


def test_a_failed_batched_publish_falls_back_and_every_job_is_claimed_exactly_once(server) -> None:
    """7 stage messages (6 single jobs, one chunk of 4) published as one batch whose LPUSH
    pipeline loses its connection after Redis queued the first 3: ``publish`` does not raise
    (kombu does not retry the pipeline: without the fallback the ConnectionError reaches the
    caller), every message is on the queue (a copy of some: the fallback sends all 7 again), and
    taking the queue as a stage worker does (its claim per message, ``claim_stages``) claims
    each of the 10 jobs exactly once, the 3 copies finding their jobs claimed already; no job
    is left in ``pending_init``. Fails if the fallback is gone (publish raises or messages are
    missing) or a copy claimed its job again."""
    url, port, client = server
    store = JobStore(client, result_ttl_s=60)
    job_ids = new_jobs(store, 10)
    messages: list[Message] = [(Stage.INIT, None, job_id) for job_id in job_ids[:6]] + [(Stage.INIT, None, job_ids[6:])]
    with CuttingProxy(port, AfterCommand(b"LPUSH", after=3)) as proxy:
        app = create_celery(Settings(redis_url=url, broker_url=proxy.url("redis") + "/1"), set_as_current=False)
        try:
            publish(messages, celery=app)
        finally:
            app.close()
    assert proxy.cuts == 1
    broker = redis.Redis.from_url(url + "/1")
    # oldest first, as a worker takes them (kombu LPUSHes and BRPOPs)
    payloads = [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
                for raw in reversed(broker.lrange(Stage.INIT.value, 0, -1))]
    sent = [payload for _, _, payload in messages]
    # each message is there, none more than twice; the 3 the cut batch queued may have a copy
    # (the fallback sends them all again: Redis's reply that they landed was lost)
    copies = Counter(json.dumps(payload) for payload in payloads)
    assert sorted(copies) == sorted(json.dumps(payload) for payload in sent), payloads
    assert set(copies.values()) <= {1, 2} and len(payloads) > len(sent), payloads
    claimed: Counter[str] = Counter()
    for payload in payloads:
        ids = payload if isinstance(payload, list) else [payload]
        for job_id, claim in zip(ids, store.claim_stages(ids, Stage.INIT)):
            claimed[job_id] += claim.ok
            assert claim.ok or claim.previous is JobStatus.INIT
    assert claimed == Counter({job_id: 1 for job_id in job_ids})
    counts = store.status_counts()
    assert counts.get(JobStatus.INIT.value) == 10 and not counts.get(JobStatus.PENDING_INIT.value)
