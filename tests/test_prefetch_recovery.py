"""A killed worker's prefetched stage comes back: stages are acked when they start, so a worker
busy with one stage holds the next message fetched but unacked; after a SIGKILL the broker
redelivers it after PRORL_VISIBILITY_TIMEOUT_S and another worker runs it."""
from __future__ import annotations

import os
import time

import httpx
import pytest
import redis

from prorl_celery.local import LocalCluster
from prorl_celery.status import Stage
from tests.support.services import ROOT, eventually

VISIBILITY_S = 5


@pytest.fixture(scope="module")
def one_thread_init(tmp_path_factory):
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_HEARTBEAT_S": "1",
           "PRORL_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S)}
    with LocalCluster(env=env, gateway_workers=1, log_dir=tmp_path_factory.mktemp("prefetch"),
                      concurrency={Stage.INIT: 1, Stage.RUN: 2, Stage.EVAL: 2}) as cluster:
        yield cluster


def test_a_killed_workers_prefetched_stage_is_redelivered(one_thread_init) -> None:
    cluster = one_thread_init
    # closed at the end: a keep-alive connection left open holds gunicorn's graceful stop for
    # the whole of the cluster's 10 s grace
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        check_redelivery(cluster, gateway)


def check_redelivery(cluster: LocalCluster, gateway: httpx.Client) -> None:
    broker = redis.Redis.from_url(cluster.broker_url)
    # the first keeps the only INIT thread busy (on its first attempt); the others are quick
    sleeps = [60, 0, 0]
    jobs = [gateway.post("/jobs", json={"task": "fault", "max_attempts": 2, "instance": {
        "init_sleep_s": sleep, "sleep_first_attempt_only": True}}).json()["job_id"] for sleep in sleeps]

    def status(job_id: str) -> str:
        return gateway.get(f"/jobs/{job_id}").json()["status"]

    # the one INIT thread runs one job and holds the next fetched but unstarted (unacked)
    eventually(lambda: [status(j) for j in jobs] == ["init", "pending_init", "pending_init"], 30,
               "the first job in INIT")
    eventually(lambda: broker.hlen("unacked") == 1, 30, "one prefetched message held by the worker")
    assert broker.llen(Stage.INIT.value) == 1  # the third is still in the queue

    [worker] = [p for p in cluster.processes if p.name.startswith("init-")]
    killed_at = time.monotonic()
    worker.popen.kill()
    cluster.processes.remove(worker)
    cluster.start_worker(Stage.INIT, 1)

    # the running job: lease expiry, retried (attempt 2); the queued one: the new worker; the
    # prefetched one: redelivered after the visibility timeout
    eventually(lambda: all(status(j) == "completed" for j in jobs), VISIBILITY_S + 10 + 30,
               "all three jobs completed")
    assert time.monotonic() - killed_at < VISIBILITY_S + 40
    assert [gateway.get(f"/jobs/{j}").json()["attempt"] for j in jobs] == [2, 1, 1]
    assert broker.hlen("unacked") == 0
