"""Helpers the integration tests share: the scripted LLM server process, a gateway client, and
small waiting and rules-file utilities. Fixtures that start processes live in tests/conftest.py."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.state.connection import get_redis
from prorl_celery.state.store import JobStore

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "tests" / "data" / "llm_rules.json"


class LLMServer:
    """A scripted LLM server process (vLLM/SGLang/llama.cpp protocols) and its request log."""

    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process, self.port = process, port
        self.base = f"http://127.0.0.1:{port}"

    def address(self, protocol: str = "vllm") -> str:
        return self.base + ("/v1" if protocol == "vllm" else "")

    def log(self) -> list[dict]:
        return httpx.get(self.base + "/_log").json()

    def reset(self) -> None:
        httpx.post(self.base + "/_reset").raise_for_status()

    def wait_ready(self, timeout_s: float = 120) -> None:
        wait_until(lambda: httpx.get(self.base + "/health").status_code == 200, timeout_s, self.process.name,
                   self.process)


def start_llm_server(tokenizer: str, log_dir: Path, name: str, rules: Path = RULES,
                     token_delay: float = 0.0, max_model_len: int | None = None, wait: bool = True) -> LLMServer:
    """A scripted LLM server, healthy (``wait=False``: just started, :meth:`LLMServer.wait_ready`
    follows, so that several start side by side: each spends seconds importing transformers)."""
    port = free_port()
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules),
                                  "--tokenizer", tokenizer, "--port", str(port), "--token-delay", str(token_delay),
                                  *(["--max-model-len", str(max_model_len)] if max_model_len else [])],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = LLMServer(ManagedProcess(name, popen, log), port)
    if wait:
        server.wait_ready()
    return server


@contextmanager
def scripted_llm(tokenizer: str, tmp_path_factory: pytest.TempPathFactory, name: str,
                 rules: list[dict]) -> Iterator[LLMServer]:
    """A scripted LLM server answering by ``rules`` (``engines.Rule``) until the block ends."""
    server = start_llm_server(tokenizer, tmp_path_factory.mktemp(name), name, rules=rules_file(rules))
    try:
        yield server
    finally:
        server.process.stop()


class Gateway(httpx.Client):
    """An HTTP client on the gateway with the few calls most tests make."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(base_url=cluster.gateway_url, timeout=120)
        self.cluster = cluster

    def process(self, instance: dict, **fields) -> dict:
        response = self.post("/process", json={"instance": instance, **fields})
        assert response.status_code == 200, response.text
        return response.json()

    def submit(self, instance: dict, **fields) -> str:
        response = self.post("/jobs", json={"instance": instance, **fields})
        assert response.status_code == 202, response.text
        return response.json()["job_id"]

    def result(self, job_id: str, wait: float = 60) -> dict:
        response = self.get(f"/jobs/{job_id}", params={"wait": wait})
        assert response.status_code == 200, f"job {job_id} not finished: {response.text}"
        return response.json()

    def wait_for_stage(self, job_id: str, status: str, timeout_s: float = 30) -> None:
        wait_until(lambda: self.get(f"/jobs/{job_id}").json().get("status") == status, timeout_s,
                   f"job {job_id} in {status}")


def settle(cluster: LocalCluster, post: Callable[[str], int], timeout_s: float = 30) -> None:
    """End a test's jobs before the next test flushes the state: ``POST /stop`` (it cancels every
    job in flight), wait for the node's sandboxes to be stopped, then ``POST /start`` again (tests
    that share the cluster without flushing it expect a started service). ``post(path)`` returns
    the reply's status. A flush while a cancelled job's RUN still stops its sandbox would wipe the
    ledger entry it stops it by, and leave the sandbox running."""
    from prorl_celery.worker.node_sandboxes import RedisSandboxLedger
    assert post("/stop") == 200, "POST /stop failed after the test"
    ledger = RedisSandboxLedger(redis.Redis.from_url(cluster.state_url, decode_responses=True))
    left = ledger.list(cluster.node)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = ledger.list(cluster.node)
    assert post("/start") == 200, "POST /start failed after the test"
    assert not left, f"sandboxes still running {timeout_s:.0f} s after the test's jobs were cancelled: " + \
        ", ".join(f"{r.sandbox_id} (job {r.job_id}, worker {r.worker})" for r in left)


def rules_file(rules: list[dict]) -> Path:
    path = Path(tempfile.mkstemp(suffix=".json")[1])
    path.write_text(json.dumps(rules))
    return path


def eventually(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.05)


def redis_answers(check) -> bool:
    """``check()`` as a bool, False (after a short pause) while Redis does not answer: for
    ``eventually`` across a Redis restart or failover."""
    try:
        return bool(check())
    except redis.RedisError:
        time.sleep(0.1)
        return False


def own_redis_fixture(name: str):
    """A module-scoped fixture: a redis-server of the module's own, for tests that count
    ``INFO commandstats`` (it counts every client of a server). Yields its URL."""
    @pytest.fixture(scope="module")
    def own_redis(tmp_path_factory):
        url, handle = start_redis(tmp_path_factory.mktemp(name), name)
        yield url
        handle.stop()
    return own_redis


@contextmanager
def flushed_client(url: str) -> Iterator[redis.Redis]:
    """A client of a redis-server of a module's own (``own_redis_fixture``), flushed before and
    after a test."""
    connection = redis.Redis.from_url(url, decode_responses=True)
    connection.flushall()
    try:
        yield connection
    finally:
        connection.flushall()


@contextmanager
def flushed_store(url: str) -> Iterator[JobStore]:
    """A job store on the flushed database ``url`` names, through the service's own client (a
    blocking pool of 1024: a plain pool caps at 100 connections, and hundreds of waiters' status
    reads at once then fail with "Too many connections" under load); its completion listener is
    closed after the test."""
    client = get_redis(url)
    client.flushdb()
    store = JobStore(client, result_ttl_s=60)
    try:
        yield store
    finally:
        store.waiter.close()


def start_gateway(cluster: LocalCluster, log_dir: Path, name: str, env: dict[str, str]) -> tuple[str, ManagedProcess]:
    """A second one-worker gunicorn on ``cluster``'s Redis, with ``env`` over the cluster's
    service environment (other settings, another worker class): ``(url, process)``, healthy."""
    port = free_port()
    log = log_dir / "gateway.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "-w", "1",
                                  "-b", f"127.0.0.1:{port}", "api:create_app()"],
                                 env={**cluster.service_env(), **env}, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    gateway = ManagedProcess(name, popen, log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/healthz").status_code == 200, 60, name, gateway)
    return url, gateway


def start_redis(log_dir: Path, name: str = "redis", *extra_args: str) -> tuple[str, ManagedProcess]:
    """A redis-server on a free loopback port, no persistence: ``(url, process)``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is required for the integration tests (apt-get install redis-server)")
    port = free_port()
    with open(log_dir / f"{name}.log", "wb") as out:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", *extra_args],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    handle = ManagedProcess(name, process, log_dir / f"{name}.log")
    url = f"redis://127.0.0.1:{port}"
    wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server", handle)
    return url, handle


def kill_run_worker(cluster: LocalCluster, concurrency: int = 8) -> None:
    """SIGKILL the cluster's RUN worker (its stages' leases then expire: the reaper retries their
    jobs), and start another in its place."""
    victim = next(p for p in cluster.processes if p.name.startswith(Stage.RUN.value + "-"))
    os.kill(victim.popen.pid, signal.SIGKILL)
    victim.popen.wait(30)
    cluster.processes.remove(victim)
    cluster.start_worker(Stage.RUN, concurrency)


@contextmanager
def killable_cluster(name: str, tokenizer: str, llm: LLMServer, tmp_path_factory: pytest.TempPathFactory,
                     concurrency: dict[Stage, int]) -> Iterator[LocalCluster]:
    """A cluster of a test module's own, whose RUN worker the module kills: bubblewrap sandboxes,
    a short lease and a fast reaper (a killed worker's jobs are retried within seconds), ``llm``
    registered."""
    env = {"PRORL_NODE": f"{name}-{os.getpid()}", "PRORL_SANDBOX_DIR": str(tmp_path_factory.mktemp("sbx")),
           "PRORL_RUNTIME": "bubblewrap", "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5",
           "PRORL_VISIBILITY_TIMEOUT_S": "10", "PRORL_SHUTDOWN_GRACE_S": "1", "PRORL_BACKEND_WAIT_POLL_S": "0.1"}
    local = LocalCluster(redis_url=None, tokenizer=tokenizer, gateway_workers=1, env=env, concurrency=concurrency,
                         log_dir=tmp_path_factory.mktemp(f"{name}-cluster"))
    with local:
        with Gateway(local) as client:
            assert client.post("/add_llm_server", json={"address": llm.address()}).status_code == 200
        yield local
