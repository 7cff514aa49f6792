"""LLM backend health and removal: probes, routing around unhealthy backends, re-probes, and
``/clear_llm_server`` by address.

The pool's own tests run against the session's redis-server and a real HTTP server in a thread
(its answer set per test); the service tests run the gateway app in this process against the
test cluster's real workers and scripted LLM servers."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from prorl_celery.dev.local import free_port
from prorl_celery.llm.pool import BackendPool, Health, probe
from prorl_celery.state import keys
from prorl_celery.state.connection import get_redis
from tests.support.services import eventually


class ProbedServer:
    """A real HTTP server on loopback answering every GET with ``status`` (and counting them)."""

    def __init__(self) -> None:
        self.status, self.gets = 200, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner.gets.append(self.path)
                body = b'{"data": [{"id": "m"}]}'
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def http_server() -> Iterator[ProbedServer]:
    server = ProbedServer()
    yield server
    server.close()


@pytest.fixture
def pool(redis_url) -> Iterator[BackendPool]:
    client = get_redis(redis_url + "/3")
    client.flushdb()
    yield BackendPool(client)
    client.flushdb()


def dead_address() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


# -- probes ------------------------------------------------------------------------------------

def test_a_probe_asks_the_protocols_route_and_says_what_it_got(http_server):
    assert probe(http_server.base + "/v1", "vllm").healthy and http_server.gets == ["/v1/models"]
    assert probe(http_server.base, "sglang").healthy and http_server.gets[-1] == "/health"
    http_server.status = 503
    sick = probe(http_server.base + "/v1", "vllm")
    assert not sick.healthy and "answered 503" in sick.detail and http_server.base in sick.detail
    dead = dead_address()
    refused = probe(dead, "vllm", timeout_s=1)
    assert not refused.healthy and "ConnectionRefusedError" in refused.detail
    assert dead.removesuffix("/v1") in refused.detail


# -- routing -----------------------------------------------------------------------------------

def test_unhealthy_backends_are_out_of_routing_until_healthy_again(pool):
    pool.add("http://a:1/v1")
    pool.add("http://b:1/v1", health=Health(False, detail="refused"))
    assert {pool.acquire().address for _ in range(4)} == {"http://a:1/v1"}
    pool.mark_unhealthy("http://a:1", "no answer")  # the other form of the address names it too
    assert pool.acquire() is None and pool.acquire_many([("j1", 1), ("j2", 1)]) == [None, None]
    pool.set_health("http://b:1/v1", Health(True, detail="answered"))
    assert pool.acquire().address == "http://b:1/v1"
    states = {b.address: (b.healthy, b.detail) for b in pool.list()}
    assert states == {"http://a:1/v1": (False, "no answer"), "http://b:1/v1": (True, "answered")}


def test_since_moves_only_when_the_state_changes(pool):
    pool.add("http://a:1/v1")
    up = pool.health("http://a:1/v1")
    assert up.healthy and up.since is not None
    first = pool.set_health("http://a:1/v1", Health(False, detail="one"))
    again = pool.set_health("http://a:1/v1", Health(False, detail="two"))
    assert first.since >= up.since and again.since == first.since and again.detail == "two"
    assert pool.mark_unhealthy("http://nowhere:1/v1", "x") == []  # not registered: nothing written
    assert pool.redis.hget(keys.LLM_HEALTH, "http://nowhere:1/v1") is None


def test_a_backend_registered_before_health_is_healthy(pool):
    pool.add("http://a:1/v1")
    pool.redis.hdel(keys.LLM_HEALTH, "http://a:1/v1")  # as an older version left it
    (info,) = pool.list()
    assert (info.healthy, info.since) == (True, None) and pool.acquire().address == "http://a:1/v1"


# -- re-probes ---------------------------------------------------------------------------------

def test_a_reprobe_puts_a_backend_back_once_it_answers_at_most_once_per_interval(pool, http_server):
    address = http_server.base + "/v1"
    http_server.status = 500
    pool.add(address, health=probe(address))
    assert not pool.health(address).healthy
    assert set(pool.reprobe("worker-a", timeout_s=1, interval_s=30)) == {address}
    http_server.status = 200
    # another process in the same interval: the lock is held, no probe
    assert pool.reprobe("worker-b", timeout_s=1, interval_s=30) == {} and len(http_server.gets) == 2
    assert pool.acquire() is None
    pool.redis.delete(keys.llm_probe_lock(address))  # the interval has passed
    assert pool.reprobe("worker-b", timeout_s=1, interval_s=30)[address].healthy
    assert pool.acquire().address == address
    assert pool.reprobe("worker-b", timeout_s=1, interval_s=30) == {}  # healthy ones are not probed


def test_probe_all_takes_a_backend_gone_since_its_registration_out_of_routing(pool, http_server):
    """After a restart the pool in Redis still lists a server that is gone as healthy: a RUN
    worker's start-up probe of every backend puts it out of routing before a job is assigned."""
    gone, live = dead_address(), http_server.base + "/v1"
    pool.add(gone)  # healthy when it was registered
    pool.add(live)
    found = pool.probe_all(timeout_s=1)
    assert (found[gone].healthy, found[live].healthy) == (False, True)
    assert not pool.health(gone).healthy and "ConnectionRefusedError" in pool.health(gone).detail
    assert {pool.acquire(f"job-{i}").address for i in range(4)} == {live}


# -- removal -----------------------------------------------------------------------------------

def test_remove_one_backend_by_either_form_of_its_address(pool):
    pool.add("http://a:1/v1", version=3)
    pool.add("http://b:1/v1", health=Health(False, detail="refused"))
    taken = pool.acquire()
    generation = pool.generation()
    assert pool.remove("http://a:1") == (["http://a:1/v1"], generation + 1)
    assert [b.address for b in pool.list()] == ["http://b:1/v1"] and pool.version("http://a:1/v1") is None
    pool.release(taken.address)  # the job in flight on it ends: its count goes back down
    assert pool.redis.hget(keys.LLM_INFLIGHT, "http://a:1/v1") == "0"
    assert pool.remove("http://b:1/v1/")[0] == ["http://b:1/v1"]
    assert pool.redis.scard(keys.LLM_UNHEALTHY) == 0 and pool.redis.hlen(keys.LLM_HEALTH) == 0
    with pytest.raises(KeyError):
        pool.remove("http://a:1/v1")


# -- through the service -----------------------------------------------------------------------

def math(problem: str, answer: str) -> dict:
    return {"data_source": "math", "problem": problem, "answer": answer}


def test_an_unreachable_backend_is_added_unhealthy_and_shown_so(gateway, llm_servers):
    """Through the real gunicorn gateway (its gevent worker probes)."""
    dead = dead_address()
    added = gateway.post("/add_llm_server", json={"address": dead})
    assert added.status_code == 200, added.text
    assert (added.json()["added"], added.json()["healthy"]) == (True, False)
    assert "ConnectionRefusedError" in added.json()["detail"] and added.json()["since"] > 0
    assert added.json()["warning"].startswith(f"{dead} did not answer") and "gets no job" in added.json()["warning"]
    live = gateway.post("/add_llm_server", json={"address": llm_servers[0].address()}).json()
    assert live["healthy"] and "answered 200" in live["detail"]
    status = {b["address"]: b for b in gateway.get("/status").json()["backends"]}
    assert (status[dead]["healthy"], status[llm_servers[0].address()]["healthy"]) == (False, True)
    listed = {b["address"]: b["detail"] for b in gateway.get("/llm_servers").json()["servers"]}
    assert listed[dead] == added.json()["detail"]
    assert f'prorl_backend_healthy{{address="{dead}"}} 0.0' in gateway.get("/metrics").text
    # jobs go to the healthy one only
    results = [gateway.process(math("What is 2 + 3?", "5")) for _ in range(3)]
    assert {r["backend"] for r in results} == {llm_servers[0].address()}, json.dumps(results[0])[:3000]


def test_a_job_waits_while_its_only_backend_is_unhealthy_and_runs_once_a_reprobe_finds_it(app_gateway, llm_servers):
    server = llm_servers[1]
    server.reset()
    assert app_gateway.post("/add_llm_server", json={"address": server.address()}).json["healthy"]
    pool = app_gateway.application.extensions["prorl"].pool
    assert pool.mark_unhealthy(server.address(), "RUN: connection reset") == [server.address()]
    # as if a worker had just probed it: no re-probe for 4 s (else a reaper tick could find it
    # healthy before the job is seen waiting, on a loaded machine)
    pool.redis.set(keys.llm_probe_lock(server.address()), "this test", ex=4)
    job_id = app_gateway.submit(math("What is 2 + 3?", "5"))
    app_gateway.wait_for_stage(job_id, "run")
    assert server.log() == []  # waiting, as with no backend registered
    # a RUN worker's reaper tick probes it (PRORL_BACKEND_PROBE_INTERVAL_S: at most 10 s)
    eventually(lambda: pool.health(server.address()).healthy, 20, "a RUN worker's re-probe")
    result = app_gateway.result(job_id)
    assert (result["status"], result["backend"]) == ("completed", server.address())


def test_clear_one_backend_by_address_while_a_job_runs_on_it(app_gateway, llm_servers):
    old, new = llm_servers
    old.reset(), new.reset()
    for server in (old, new):
        assert app_gateway.post("/add_llm_server", json={"address": server.address()}).status_code == 200
    app_gateway.application.extensions["prorl"].pool.mark_unhealthy(new.address(), "held back for this test")
    in_flight = app_gateway.submit(math("SLOW but finishing", "1"), sampling_params={"max_tokens": 64})
    eventually(lambda: len(old.log()) == 1, 20, "the in-flight job reached its backend")
    generation = app_gateway.get("/llm_servers").json["generation"]
    removed = app_gateway.post("/clear_llm_server", json={"address": old.base})  # without /v1: the same server
    assert removed.status_code == 200, removed.text
    assert removed.json == {"generation": generation + 1, "removed": [old.address()]}
    assert [s["address"] for s in app_gateway.get("/llm_servers").json["servers"]] == [new.address()]
    unknown = app_gateway.post("/clear_llm_server", json={"address": old.address()})
    assert unknown.status_code == 400 and new.address() in unknown.json["message"]
    app_gateway.post("/cancel", json={"job_id": in_flight})  # its 60 s turn was on the old backend
    assert app_gateway.result(in_flight)["backend"] == old.address()
    assert app_gateway.post("/clear_llm_server").json["generation"] == generation + 2  # no body: all
    assert app_gateway.get("/llm_servers").json["servers"] == []
    assert redis.Redis.from_url(app_gateway.cluster.state_url).exists(keys.LLM_UNHEALTHY) == 0
