"""INIT and EVAL consumed without acks, with real workers, a real gateway and a real redis-server.

1. The fetch gate (``celery_app.StageFetchGate``): an INIT worker with one thread, busy, leaves
   the other messages in the queue for a second worker (no hoarding: kombu's prefetch limit
   counts acked deliveries only), writes nothing to kombu's ``unacked`` hash, and a thread that
   frees fetches the next message at once (the hub is woken, not left to its timer).
2. The safety net (``leases.republish_lost``): a message that leaves the queue and is never
   claimed (popped here as a worker killed right after its BRPOP would) is published again by
   the reaper after ``PRORL_REPUBLISH_AFTER_S`` and the job completes, for INIT and for EVAL;
   jobs waiting behind a backlog are not published again.
3. Workers of several stages: ``-Q init,eval`` (the fetch gate alone) hands its one thread from
   one queue to the other at once and, busy, leaves the queue to another worker;
   ``-Q init,run,eval`` (both gates on one pool) runs the whole pipeline.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from prorl_celery.state import keys
from tests.support.services import ROOT, eventually

REPUBLISH_AFTER_S = 2.0
BASE_ENV = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_HEARTBEAT_S": "1"}


def post(gateway: httpx.Client, **instance: object) -> str:
    return gateway.post("/jobs", json={"task": "fault", "instance": instance}).json()["job_id"]


def status_of(state: redis.Redis, job_id: str) -> str:
    return state.hget(keys.job(job_id), "status") or ""


@pytest.fixture(scope="module")
def one_thread_init(tmp_path_factory) -> Iterator[tuple[LocalCluster, httpx.Client, redis.Redis, redis.Redis]]:
    with LocalCluster(env=BASE_ENV, gateway_workers=1, log_dir=tmp_path_factory.mktemp("unacked-gate"),
                      concurrency={Stage.INIT: 1, Stage.RUN: 2, Stage.EVAL: 2}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        yield (cluster, gateway, redis.Redis.from_url(cluster.state_url, decode_responses=True),
               redis.Redis.from_url(cluster.broker_url, decode_responses=True))


def test_a_freed_thread_fetches_the_next_message_at_once(one_thread_init) -> None:
    """Eight 0.3 s INIT stages through one thread take 2.4 s: with a shut gate left to the
    hub's timer (about a second) each hand-over would add most of a second (7 s or more)."""
    _, gateway, state, _ = one_thread_init
    stage_s, count = 0.3, 8
    jobs = [post(gateway, init_sleep_s=stage_s) for _ in range(count)]
    eventually(lambda: status_of(state, jobs[0]) not in ("", "pending_init"), 30, "the first INIT claimed")
    started = time.monotonic()
    eventually(lambda: all(status_of(state, j) not in ("pending_init", "init") for j in jobs), 30,
               "every INIT done")
    took = time.monotonic() - started
    assert took < (count - 1) * stage_s + 1.5, f"{count} INIT stages of {stage_s} s on one thread took {took:.2f} s"
    eventually(lambda: all(status_of(state, j) == "completed" for j in jobs), 30, "all completed")


def check_a_busy_worker_leaves_the_queue_to_another(setup, stages: Stage | tuple[Stage, ...],
                                                    slow_s: float) -> None:
    """The only thread of the worker of ``setup`` busy with a slow INIT: three more jobs stay
    queued, and a second worker of ``stages`` runs them while the slow one is still in INIT."""
    cluster, gateway, state, broker = setup
    slow = post(gateway, init_sleep_s=slow_s)
    eventually(lambda: status_of(state, slow) == "init", 30, "the slow job in INIT")
    quick = [post(gateway) for _ in range(3)]
    time.sleep(1.0)  # a hoarding worker would have fetched them by now
    assert broker.llen(Stage.INIT.value) == 3
    assert [status_of(state, j) for j in quick] == ["pending_init"] * 3
    # the INIT deliveries (the slow one's included) left no ack bookkeeping behind
    assert broker.hlen("unacked") == 0 and broker.zcard("unacked_index") == 0
    cluster.start_worker(stages, 1)
    # the first worker's only thread is busy with the slow job: the second one runs them
    eventually(lambda: all(status_of(state, j) == "completed" for j in quick), 60, "the quick jobs completed")
    assert status_of(state, slow) == "init"
    eventually(lambda: status_of(state, slow) == "completed", 60, "the slow job completed")
    assert broker.hlen("unacked") == 0


@pytest.mark.extended  # kept out of the default run's 10 minutes; CI's extended phase runs it
def test_a_busy_worker_leaves_the_queue_to_another(one_thread_init) -> None:
    check_a_busy_worker_leaves_the_queue_to_another(one_thread_init, Stage.INIT, slow_s=25)


@pytest.fixture(scope="module")
def no_init_worker(tmp_path_factory) -> Iterator[tuple[LocalCluster, httpx.Client, redis.Redis, redis.Redis]]:
    env = {**BASE_ENV, "PRORL_REPUBLISH_AFTER_S": str(REPUBLISH_AFTER_S)}
    with LocalCluster(env=env, gateway_workers=1, log_dir=tmp_path_factory.mktemp("unacked-republish"),
                      concurrency={Stage.RUN: 1}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        yield (cluster, gateway, redis.Redis.from_url(cluster.state_url, decode_responses=True),
               redis.Redis.from_url(cluster.broker_url, decode_responses=True))


def take_message(broker: redis.Redis, queue: str, job_id: str) -> None:
    """Take the job's message off the queue, as a worker killed right after its BRPOP would."""
    raw = broker.rpop(queue)
    assert raw is not None and json.loads(raw)["headers"]["argsrepr"] == repr([job_id])


def republished(state: redis.Redis) -> int:
    return int(state.hget(keys.METRIC_COUNTERS, "republished_messages") or 0)


@pytest.mark.extended  # kept out of the default run's 10 minutes; CI's extended phase runs it
def test_lost_messages_are_published_again_and_a_backlog_is_not(no_init_worker) -> None:
    cluster, gateway, state, broker = no_init_worker
    job = post(gateway)
    take_message(broker, Stage.INIT.value, job)
    lost_at = time.monotonic()
    eventually(lambda: broker.llen(Stage.INIT.value) == 1, REPUBLISH_AFTER_S + 10, "the INIT message published again")
    assert time.monotonic() - lost_at > REPUBLISH_AFTER_S - 1.0  # not before the bound
    assert status_of(state, job) == "pending_init"

    init_worker = cluster.start_worker(Stage.INIT, 1)
    eventually(lambda: status_of(state, job) == "pending_eval", 60, "the job through INIT and RUN")
    take_message(broker, Stage.EVAL.value, job)
    eventually(lambda: broker.llen(Stage.EVAL.value) == 1, REPUBLISH_AFTER_S + 10, "the EVAL message published again")
    cluster.start_worker(Stage.EVAL, 1)
    eventually(lambda: status_of(state, job) == "completed", 60, "the job completed")
    eventually(lambda: republished(state) == 2, 10, "both counted (metrics flush every 2 s)")
    logs = "".join(p.log_path.read_text(errors="replace") for p in cluster.processes if p.name != "redis")
    assert f"job {job}: in pending_init for over" in logs and f"job {job}: in pending_eval for over" in logs

    # a backlog with no INIT worker: every job is past the bound, and none is published again
    init_worker.stop()
    cluster.processes.remove(init_worker)
    backlog = [post(gateway) for _ in range(10)]
    time.sleep(REPUBLISH_AFTER_S + 3)
    assert broker.llen(Stage.INIT.value) == len(backlog)
    assert all(status_of(state, j) == "pending_init" for j in backlog)
    cluster.start_worker(Stage.INIT, 2)
    eventually(lambda: all(status_of(state, j) == "completed" for j in backlog), 90, "the backlog completed")
    time.sleep(2.5)  # a metrics flush
    assert republished(state) == 2



@pytest.fixture(scope="module")
def init_eval_worker(tmp_path_factory) -> Iterator[tuple[LocalCluster, httpx.Client, redis.Redis, redis.Redis]]:
    """INIT and EVAL on one worker of one thread (``-Q init,eval -c 1``): StageFetchGate alone
    governs its fetches, as RUN (RunSlotGate, ``worker_disable_prefetch``) is another worker's."""
    with LocalCluster(env=BASE_ENV, gateway_workers=1, log_dir=tmp_path_factory.mktemp("unacked-mixed"),
                      concurrency={Stage.RUN: 4}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        cluster.start_worker((Stage.INIT, Stage.EVAL), 1)
        cluster.wait_for_workers()
        yield (cluster, gateway, redis.Redis.from_url(cluster.state_url, decode_responses=True),
               redis.Redis.from_url(cluster.broker_url, decode_responses=True))


def test_a_mixed_worker_hands_over_from_one_queue_to_the_other_at_once(init_eval_worker) -> None:
    """Six jobs' INIT and EVAL stages of 0.3 s, twelve stages on one thread: 3.6 s. A freed
    thread left to the hub's timer (about a second) would add most of a second per stage."""
    _, gateway, state, broker = init_eval_worker
    stage_s, count = 0.3, 6
    jobs = [post(gateway, init_sleep_s=stage_s, eval_sleep_s=stage_s) for _ in range(count)]
    eventually(lambda: status_of(state, jobs[0]) not in ("", "pending_init"), 30, "the first INIT claimed")
    started = time.monotonic()
    eventually(lambda: all(status_of(state, j) == "completed" for j in jobs), 60, "every job completed")
    took = time.monotonic() - started
    assert took < (2 * count - 1) * stage_s + 2.0, f"{2 * count} stages of {stage_s} s on one thread took {took:.2f} s"
    assert broker.hlen("unacked") == 0  # RUN's acks (at admission) left nothing behind either


@pytest.mark.extended  # kept out of the default run's 10 minutes; CI's extended phase runs it
def test_a_busy_mixed_worker_leaves_the_queue_to_another(init_eval_worker) -> None:
    check_a_busy_worker_leaves_the_queue_to_another(init_eval_worker, (Stage.INIT, Stage.EVAL), slow_s=15)


def test_one_worker_of_every_stage_runs_the_pipeline(tmp_path_factory) -> None:
    """``-Q init,run,eval``, the single-node set-up: both gates on one pool of two threads (and
    two RUN slots); eight jobs of three 0.3 s stages all complete and leave no ack behind."""
    with LocalCluster(env=BASE_ENV, gateway_workers=1, log_dir=tmp_path_factory.mktemp("unacked-all"),
                      concurrency={}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        cluster.start_worker((Stage.INIT, Stage.RUN, Stage.EVAL), 2)
        cluster.wait_for_workers()
        state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
        jobs = [post(gateway, init_sleep_s=0.3, run_sleep_s=0.3, eval_sleep_s=0.3) for _ in range(8)]
        eventually(lambda: all(status_of(state, j) == "completed" for j in jobs), 60, "every job completed")
        assert redis.Redis.from_url(cluster.broker_url).hlen("unacked") == 0
