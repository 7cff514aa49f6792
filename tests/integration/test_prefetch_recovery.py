"""A killed INIT worker loses no stage: INIT is consumed without acks and fetched only while a
thread is free for it (celery_app.StageFetchGate), so a worker busy with its one thread holds no
message, and after a SIGKILL the queued ones run on another worker while the running one is
retried through its lease. (Before, it held the next message fetched but unacked, which the
broker redelivered after PRORL_VISIBILITY_TIMEOUT_S.) A message lost between a worker's fetch and
its claim is published again by the reaper: tests/integration/test_unacked_stages.py."""
from __future__ import annotations

import os
import time

import httpx
import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
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


def test_a_killed_init_worker_loses_no_stage(one_thread_init) -> None:
    cluster = one_thread_init
    # closed at the end: a keep-alive connection left open holds gunicorn's graceful stop for
    # the whole of the cluster's 10 s grace
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as gateway:
        check_recovery(cluster, gateway)


def check_recovery(cluster: LocalCluster, gateway: httpx.Client) -> None:
    broker = redis.Redis.from_url(cluster.broker_url)
    # the first keeps the only INIT thread busy (on its first attempt); the others are quick
    sleeps = [60, 0, 0]
    jobs = [gateway.post("/jobs", json={"task": "fault", "max_attempts": 2, "instance": {
        "init_sleep_s": sleep, "sleep_first_attempt_only": True}}).json()["job_id"] for sleep in sleeps]

    def status(job_id: str) -> str:
        return gateway.get(f"/jobs/{job_id}").json()["status"]

    # the one INIT thread runs one job and fetches nothing more while it is busy
    eventually(lambda: [status(j) for j in jobs] == ["init", "pending_init", "pending_init"], 30,
               "the first job in INIT")
    time.sleep(1.0)
    assert broker.llen(Stage.INIT.value) == 2 and broker.hlen("unacked") == 0  # both still in the queue

    [worker] = [p for p in cluster.processes if p.name.startswith("init-")]
    killed_at = time.monotonic()
    worker.popen.kill()
    cluster.processes.remove(worker)
    cluster.start_worker(Stage.INIT, 1)

    # the running job: lease expiry, retried (attempt 2); the queued ones: the new worker
    eventually(lambda: all(status(j) == "completed" for j in jobs), VISIBILITY_S + 10 + 30,
               "all three jobs completed")
    assert time.monotonic() - killed_at < VISIBILITY_S + 40
    assert [gateway.get(f"/jobs/{j}").json()["attempt"] for j in jobs] == [2, 1, 1]
    assert broker.hlen("unacked") == 0
