"""With Redis or the broker unreachable the gateway answers ``503 service_unavailable`` (never
``500 internal_error``), and the trainer client retries until they are back.

A real gunicorn gateway on a redis-server of this module's own, on a fixed port, stopped and
started again on that port; no workers (nothing here needs a job to run)."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from prorl_celery.core.errors import ServiceUnavailable
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.trainer.client import RetryPolicy, RolloutClient
from tests.support.services import ROOT, start_gateway

pytestmark = pytest.mark.integration

FAULT = {"data_source": "fault"}


class RestartableRedis:
    """A redis-server on one port that a test stops and starts again (no persistence: what it
    held is gone after a restart, which nothing here needs)."""

    def __init__(self, log_dir: Path) -> None:
        self.port, self.log_dir = free_port(), log_dir
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: ManagedProcess | None = None

    def start(self) -> None:
        log = self.log_dir / "redis.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = ManagedProcess("redis", popen, log)
        wait_until(lambda: redis.Redis.from_url(self.url).ping(), 20, "redis-server", self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture(scope="module")
def outage(tmp_path_factory) -> Iterator[tuple[LocalCluster, RestartableRedis]]:
    log_dir = tmp_path_factory.mktemp("outage")
    server = RestartableRedis(log_dir)
    server.start()
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cluster = LocalCluster(redis_url=server.url, concurrency={}, gateway_workers=1, env=env, log_dir=log_dir)
    try:
        with cluster:
            yield cluster, server
    finally:
        server.stop()


@pytest.fixture
def redis_down(outage) -> Iterator[tuple[LocalCluster, RestartableRedis]]:
    """Redis is stopped for the test, and running again after it."""
    cluster, server = outage
    server.stop()
    try:
        yield cluster, server
    finally:
        if server.process is None:
            server.start()
        wait_until(lambda: httpx.get(cluster.gateway_url + "/healthz").status_code == 200, 30, "gateway on Redis")


#: one request per kind of endpoint: a blocking submit, a submit, a read, a wait, the status
REQUESTS = [("POST", "/process", {"instance": FAULT}), ("POST", "/jobs", {"instance": FAULT}),
            ("POST", "/jobs", [{"instance": FAULT}] * 3), ("GET", "/jobs/some-job", None),
            ("GET", "/jobs/some-job?wait=5", None), ("GET", "/status", None), ("GET", "/healthz", None)]


def test_every_endpoint_answers_503_service_unavailable_while_redis_is_down(redis_down):
    cluster, _ = redis_down
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        for method, path, body in REQUESTS:
            started = time.monotonic()
            response = client.request(method, path, json=body)
            assert response.status_code == 503, (method, path, response.text)
            assert response.json()["code"] == "service_unavailable", (method, path, response.text)
            assert "Redis cannot be reached" in response.json()["message"], response.text
            assert time.monotonic() - started < 10, (method, path, "answered, but slowly")


def test_a_blink_shorter_than_the_gateways_retry_is_no_503(redis_down):
    """Redis back 0.8 s after a request found it down: the gateway's own retry
    (``PRORL_GATEWAY_REDIS_RETRY_S``, 2 s) rides it out and the request succeeds."""
    cluster, server = redis_down
    restarted = threading.Timer(0.8, server.start)
    restarted.start()
    try:
        response = httpx.post(f"{cluster.gateway_url}/jobs", json={"instance": FAULT}, timeout=30)
    finally:
        restarted.join()
    assert response.status_code == 202, response.text


def test_the_client_retries_and_succeeds_when_redis_is_back_within_its_deadline(redis_down):
    cluster, server = redis_down
    # past the gateway's own 2 s of retries, so that the client has to retry
    restarted = threading.Timer(5.0, server.start)
    restarted.start()
    try:
        with RolloutClient(cluster.gateway_url, retry=RetryPolicy(deadline_s=30)) as client:
            job_id = client.submit(FAULT)
            assert client.status()["jobs"]["pending_init"] == 1  # the one job, created once
            assert client.aio.retried >= 1
    finally:
        restarted.join()
    pending = httpx.get(f"{cluster.gateway_url}/jobs/{job_id}")
    assert pending.status_code == 202 and pending.json()["status"] == "pending_init"


def test_the_client_raises_service_unavailable_once_its_retries_are_spent(redis_down):
    cluster, _ = redis_down
    with RolloutClient(cluster.gateway_url, retry=RetryPolicy(attempts=3, backoff_s=0.05, deadline_s=5)) as client:
        with pytest.raises(ServiceUnavailable, match="Redis cannot be reached"):
            client.status()


def test_an_unreachable_broker_is_503_service_unavailable_too(outage, tmp_path):
    cluster, _ = outage
    url, gateway = start_gateway(cluster, tmp_path, "gateway-dead-broker",
                                 {"PRORL_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})
    try:
        response = httpx.get(url + "/status", timeout=60)
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "service_unavailable"
    finally:
        gateway.stop()
