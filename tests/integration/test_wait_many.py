"""One request waits for many jobs: ``POST /jobs/wait`` streams each result as it ends (NDJSON),
through the gateway app in this process (Flask's test client, and a real socket for a client
that goes away) on the test cluster's Redis and workers; the trainer client's ``as_completed``
over the cluster's gunicorn, across a proxy that cuts the stream."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from prorl_celery.dev.local import wait_until
from prorl_celery.trainer.client import JobRequest, RolloutClient
from tests.support.cutting_proxy import AfterNdjsonLines, CuttingProxy
from tests.support.services import start_gateway

#: every result line is GET /jobs/<id>'s body of an ended job
TERMINAL = {"completed", "failed", "cancelled", "timeout"}


@pytest.fixture
def gateway(app_gateway):
    return app_gateway


@pytest.fixture
def waiter(gateway_app):
    return gateway_app.extensions["prorl"].store.waiter


def job(run_sleep_s: float = 0.0, **extra) -> dict:
    return {"data_source": "fault", "run_sleep_s": run_sleep_s, **extra}


def stream(gateway, job_ids: list[str], **fields):
    """The streamed response (not buffered) and an iterator of (seconds since the call, lines)."""
    started = time.monotonic()
    response = gateway.post("/jobs/wait", json={"job_ids": job_ids, **fields}, buffered=False)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/x-ndjson"

    def chunks():
        for chunk in response.iter_encoded():
            lines = [json.loads(line) for line in chunk.decode().splitlines() if line.strip()]
            yield time.monotonic() - started, lines
    return response, chunks()


def test_results_stream_in_the_order_jobs_end_those_ended_first(gateway, waiter, monkeypatch):
    monkeypatch.setattr("prorl_celery.wire.results.REPORT_SLICE", 1)  # a read and a chunk per record
    gateway.submit(job(), job_id="done2")
    gateway.submit(job(), job_id="done")
    assert gateway.result("done")["status"] == gateway.result("done2")["status"] == "completed"
    for job_id, sleep in (("slow", 1.2), ("quick", 0.3)):
        gateway.submit(job(sleep, reward=sleep), job_id=job_id)
    response, chunks = stream(gateway, ["slow", "quick", "done", "unknown", "quick", "done2"],
                              heartbeat_s=0.1)
    lines, arrived = [], {}
    for at, chunk in chunks:
        lines += chunk
        arrived.update((line["job_id"], at) for line in chunk)
    response.close()
    assert [line["job_id"] for line in lines] == ["unknown", "done", "done2", "quick", "slow"]  # a repeat once
    assert lines[0]["code"] == "job_not_found" and "'unknown'" in lines[0]["message"]
    assert arrived["done"] < 0.25 < arrived["quick"] < arrived["slow"]  # the ended one waited for nothing
    for line in lines[1:]:
        assert line == gateway.get(f"/jobs/{line['job_id']}").json  # GET's body, field for field
        assert line["status"] == "completed"
    assert [line["reward"] for line in lines[3:]] == [0.3, 1.2]
    assert waiter.waiting() == 0


def test_at_the_timeout_each_job_still_running_gets_its_pending_line(gateway, waiter, monkeypatch):
    monkeypatch.setattr("prorl_celery.wire.results.REPORT_SLICE", 1)
    gateway.submit(job(30), job_id="long2")
    gateway.submit(job(30), job_id="long")
    gateway.submit(job(), job_id="short")
    started = time.monotonic()
    response, chunks = stream(gateway, ["long2", "long", "short"], timeout_s=0.6, heartbeat_s=0.1)
    lines = [line for _, chunk in chunks for line in chunk]
    elapsed = time.monotonic() - started
    response.close()
    assert [line["job_id"] for line in lines] == ["short", "long", "long2"]
    assert lines[0]["status"] == "completed"
    for pending in lines[1:]:
        assert pending["status"] not in TERMINAL and set(pending) == {"job_id", "status", "stage", "timing"}
    assert 0.6 <= elapsed < 3.0
    assert waiter.waiting() == 0
    assert gateway.post("/cancel", json={"job_ids": ["long", "long2"]}).json["cancelled"] == ["long", "long2"]


def test_a_client_that_leaves_mid_stream_frees_its_waits(gateway, waiter):
    """Flask's test client closes the body iterator as gunicorn does when a write fails."""
    ids = [f"left-{i}" for i in range(3)]
    gateway.post("/jobs", json=[{"instance": job(30), "job_id": j} for j in ids])
    response, chunks = stream(gateway, ids, heartbeat_s=0.1)
    next(chunks)  # the stream is under way: the waits are registered
    assert waiter.waiting() == 3
    response.close()
    assert waiter.waiting() == 0
    gateway.post("/cancel", json={"job_ids": ids})


def test_a_dropped_socket_frees_the_waits_within_a_heartbeat(gateway, gateway_app, waiter):
    """Over a real socket (werkzeug's server, this process): the next keep-alive write fails
    and the server closes the stream's generator."""
    from werkzeug.serving import make_server

    gateway.post("/jobs", json=[{"instance": job(30), "job_id": "held"}])
    server = make_server("127.0.0.1", 0, gateway_app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        body = json.dumps({"job_ids": ["held"], "heartbeat_s": 0.05}).encode()
        with socket.create_connection(("127.0.0.1", server.server_port)) as sock:
            sock.sendall(b"POST /jobs/wait HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            wait_until(lambda: waiter.waiting() == 1, 5, "the wait registered")
        wait_until(lambda: waiter.waiting() == 0, 5, "the waits freed after the client left")
    finally:
        server.shutdown()
        gateway.post("/cancel", json={"job_id": "held"})


@pytest.mark.parametrize("body,field", [
    ({}, "job_ids"), ({"job_ids": []}, "job_ids"), ({"job_ids": ["a b"]}, "job_ids.0"),
    ({"job_ids": ["a"] * 10_001}, "job_ids"), ({"job_ids": ["a"], "timeout_s": -1}, "timeout_s"),
    ({"job_ids": ["a"], "timeout_s": 3601}, "timeout_s"), ({"job_ids": ["a"], "heartbeat_s": 0}, "heartbeat_s"),
    ({"job_ids": ["a"], "wait": 1}, "wait"), ({"job_ids": "a"}, "job_ids"),
])
def test_a_malformed_body_is_a_400_naming_the_field(gateway, body, field):
    response = gateway.post("/jobs/wait", json=body)
    assert response.status_code == 400, response.text
    assert response.json["code"] == "bad_request" and response.json["message"].startswith(f"{field}:"), response.json
    assert gateway.post("/jobs/wait", data="[", content_type="application/json").status_code == 400
    assert gateway.get("/jobs/wait").status_code == 404  # still GET /jobs/<id> of a job named "wait"


@pytest.fixture(scope="module")
def gthread_url(cluster, tmp_path_factory):
    """A second gunicorn on the cluster, of the thread-per-request worker class."""
    env = {"PRORL_GATEWAY_WORKER_CLASS": "gthread", "PRORL_GATEWAY_THREADS": "8"}
    url, gateway = start_gateway(cluster, tmp_path_factory.mktemp("gthread"), "gthread-gateway", env)
    yield url
    gateway.stop()


@pytest.fixture(params=["gevent", "gthread"])
def gunicorn_url(request, cluster):
    """The cluster's own gateway (gevent workers), or the gthread one."""
    import redis

    redis.Redis.from_url(cluster.state_url).flushdb()
    return cluster.gateway_url if request.param == "gevent" else request.getfixturevalue("gthread_url")


def test_the_client_streams_every_job_once_across_a_cut_connection(gunicorn_url):
    cut = AfterNdjsonLines(2)  # the first stream drops after its second result line
    with CuttingProxy(int(gunicorn_url.rsplit(":", 1)[1]), cut) as proxy, RolloutClient(proxy.url("http")) as client:
        sleeps = [0.0, 0.0, 1.5, 0.5, 2.0, 1.0]
        ids = client.submit_many([JobRequest(job(s, reward=s)) for s in sleeps])
        time.sleep(0.3)  # the first two have ended: they are the stream's first lines
        rewards = [r["reward"] for r in client.as_completed(ids + ids[:1])]
        assert sorted(rewards) == sorted(sleeps) and len(rewards) == len(sleeps)  # each job once
        assert rewards[2:] == [0.5, 1.0, 1.5, 2.0]  # in the order they ended
        assert proxy.cuts == 1 and cut.streams >= 2  # the cut stream was resumed
        assert client.aio.retried >= 1
        again = client.wait_all(list(reversed(ids)))
        assert [r["job_id"] for r in again] == list(reversed(ids))


def test_the_client_chunks_by_the_gateway_cap():
    from api.schemas import MAX_WAIT_IDS
    from prorl_celery.trainer.client import WAIT_MANY_MAX

    assert WAIT_MANY_MAX == MAX_WAIT_IDS
