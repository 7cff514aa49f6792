"""Redis Sentinel under load (issue 40): a primary, a replica and three ``redis-sentinel``
processes (``prorl_celery.dev.sentinel``, as ``prorl up --redis sentinel`` starts them), the
service launched as docs/running.md writes it, broker and state both through ``sentinel://``,
and the gateway's WAIT for one replica (``PRORL_REDIS_WAIT_REPLICAS=1``).

- 100 math jobs with the python tool in flight when the primary is SIGKILLed: the sentinels fail
  over to the replica, the dead server is started again (it rejoins as a replica), and every job
  the gateway accepted ends ``ok``; no process dies, no sandbox is left. The test prints the time
  from the kill to the first job completed after it and to the last, and the model tokens
  generated beyond those the trajectories hold (what the failover made the backend generate
  again).
- With the replica down, the gateway answers 503 naming the replicas it waited for, and 202
  again once the replica is back.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from prorl_celery.dev.local import redis_server_binary
from prorl_celery.dev.sentinel import SentinelGroup
from prorl_celery.state import keys
from prorl_celery.state.connection import open_redis
from tests.support.sandboxes import assert_no_sandbox_process, sandbox_processes
from tests.support.services import LLMServer, eventually, rules_file, start_llm_server
from tests.support.stock import PYTOOL_RULES, StockService, launched, not_ok_at_first_attempt, pytool_job, result

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="redis-sentinel is not installed"),
    pytest.mark.integration,
    pytest.mark.extended,
]

JOBS = 100


@dataclass
class Replicated:
    group: SentinelGroup
    service: StockService
    llm: LLMServer
    sandbox_dir: Path


@pytest.fixture(scope="module")
def replicated(qwen3_tokenizer, tmp_path_factory) -> Iterator[Replicated]:
    root = tmp_path_factory.mktemp("sentinel")
    binary = redis_server_binary()
    assert binary is not None
    group = SentinelGroup(binary, root / "redis", persist=True)
    group.start()
    llm = start_llm_server(qwen3_tokenizer, root, "sentinel-llm", rules=rules_file(PYTOOL_RULES))
    env = {"PRORL_REDIS_URL": group.url(1), "PRORL_BROKER_URL": group.url(0),
           "PRORL_REDIS_SENTINEL_MASTER": group.master_name, "PRORL_REDIS_WAIT_REPLICAS": "1",
           "PRORL_REDIS_WAIT_TIMEOUT_MS": "1000", "PRORL_TOKENIZER": qwen3_tokenizer,
           "PRORL_NODE": f"sentinel-{os.getpid()}", "PRORL_SANDBOX_DIR": str(root / "sbx"),
           "PRORL_REAPER_INTERVAL_S": "1"}
    try:
        with launched(env, root, llm.address()) as service:
            yield Replicated(group, service, llm, root / "sbx")
    finally:
        llm.process.stop()
        group.stop()
    assert_no_sandbox_process(root / "sbx")


def accepted(gateway_url: str, *job_ids: str, within_s: float = 60) -> None:
    """POST the jobs (one request) until the gateway accepts them (a client retries a 503)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = httpx.post(gateway_url + "/jobs", timeout=30, json=[pytool_job(job_id) for job_id in job_ids])
        if reply.status_code == 202 or time.monotonic() > deadline:
            break
        assert reply.status_code == 503, reply.text
        time.sleep(0.5)
    assert reply.status_code == 202, reply.text


def model_tokens(trajectory: dict) -> int:
    return sum(mask for mask in trajectory["response_mask"])


def test_a_failover_under_load_loses_no_accepted_job(replicated):
    url = replicated.service.gateway_url
    replicated.llm.reset()
    job_ids = [f"failover-{i}" for i in range(JOBS)]
    started = time.monotonic()
    accepted(url, *job_ids)
    print(f"\n{JOBS} jobs accepted in one request, on the replica too, in {time.monotonic() - started:.2f} s")
    eventually(lambda: httpx.get(url + "/status").json()["jobs"]["run"] >= 30, 60, "jobs in RUN")
    old = replicated.group.primary_port()
    os.kill(replicated.group.processes[replicated.group.server_named(old)].popen.pid, signal.SIGKILL)
    killed, killed_at = time.monotonic(), time.time()
    new = replicated.group.wait_failed_over(old)
    failed_over_s = time.monotonic() - killed
    # as prorl up's supervision does: the former primary starts again and rejoins as a replica
    assert replicated.group.restart_dead() == [replicated.group.server_named(old)]  # as a replica of the new one

    with ThreadPoolExecutor(JOBS) as pool:  # each wait returns as its job ends
        replies = dict(zip(job_ids, pool.map(lambda job_id: result(url, job_id, wait_s=180), job_ids)))
    assert all(reply.status_code == 200 for reply in replies.values())
    bodies = {job_id: reply.json() for job_id, reply in replies.items()}
    answered = time.monotonic() - killed
    wrong = {job_id: (body.get("status"), body.get("outcome"), body.get("attempt"), body.get("error"))
             for job_id, body in bodies.items() if body.get("outcome") != "ok"}
    assert not wrong, f"{len(wrong)} of {JOBS} accepted jobs did not end ok after the failover: {wrong}"
    # when each job ended, by its record (Redis's clock: this machine's)
    store = open_redis(replicated.group.url(1), master_name=replicated.group.master_name)
    ends = sorted(float(store.hget(keys.job(job_id), "ended_at") or 0) - killed_at for job_id in job_ids)
    generated = sum(len(entry["output_ids"]) for entry in replicated.llm.log())
    kept = sum(model_tokens(body["trajectory"]) for body in bodies.values())
    retried = sum(1 for body in bodies.values() if body.get("attempt") != 1)
    first = next((end for end in ends if end > 0), None)
    print(f"\nfailover: new primary on {new} {failed_over_s:.1f} s after the kill; first job ended after it at "
          f"{first:.1f} s, all {JOBS} terminal at {ends[-1]:.1f} s (every wait answered at {answered:.1f} s); "
          f"{retried} jobs needed another attempt; "
          f"{generated - kept} of {generated} model tokens generated beyond the trajectories'")
    assert generated >= kept

    accepted(url, "failover-after")
    assert not not_ok_at_first_attempt(url, ["failover-after"])
    assert not replicated.service.dead(), replicated.service.dead()
    eventually(lambda: not sandbox_processes(replicated.sandbox_dir), 30, "every job's sandbox stopped")


def test_without_its_replica_the_gateway_answers_503_then_202_once_it_is_back(replicated):
    url = replicated.service.gateway_url
    group = replicated.group
    group.wait_ready()
    replica = next(name for name in ("redis", "redis-replica") if group.ports[name] != group.primary_port())
    group.processes[replica].stop()
    reply = httpx.post(url + "/jobs", timeout=30, json=pytool_job("no-replica"))
    assert reply.status_code == 503, reply.text
    assert "replicas" in reply.json()["message"] and "PRORL_REDIS_WAIT_REPLICAS" in reply.json()["message"]
    group.restart(replica)
    group.wait_ready()
    # the job the 503 answered was accepted on the primary: the client's retry finds it
    accepted(url, "no-replica")
    assert not not_ok_at_first_attempt(url, ["no-replica"])
