"""An LLM server SIGKILLed mid-generation (issue 40): not a clean error, its connections reset
with requests held. Its jobs end their attempt as ``backend_error`` (no reward written for it),
it leaves the routing, and each job's retry runs on the other backend and ends ``ok``; the
service launched as docs/running.md writes it (``tests.support.stock``)."""
from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator

import httpx
import pytest

from tests.support.services import eventually, rules_file, start_llm_server
from tests.support.stock import launched, result

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.integration,
    pytest.mark.extended,
]

JOBS = 6
#: every generation held 4 s at the server: long enough to be killed mid-way
RULES = [{"match": "SLOWGEN", "scope": "prompt", "delay_s": 4.0, "replies": ["So 2 + 3 = \\boxed{5}."]}]


@pytest.fixture
def two_backends(qwen3_tokenizer, redis_url, tmp_path) -> Iterator[tuple]:
    rules = rules_file(RULES)
    doomed = start_llm_server(qwen3_tokenizer, tmp_path, "doomed-llm", rules=rules)
    spare = start_llm_server(qwen3_tokenizer, tmp_path, "spare-llm", rules=rules)
    env = {"PRORL_REDIS_URL": redis_url + "/12", "PRORL_BROKER_URL": redis_url + "/13",
           "PRORL_TOKENIZER": qwen3_tokenizer, "PRORL_NODE": f"killed-llm-{os.getpid()}",
           "PRORL_SANDBOX_DIR": str(tmp_path / "sbx")}
    try:
        with launched(env, tmp_path, doomed.address()) as service:
            yield service, doomed, spare
    finally:
        doomed.process.stop()
        spare.process.stop()


def test_a_backend_killed_mid_generation_leaves_routing_and_its_jobs_retry_elsewhere(two_backends):
    service, doomed, spare = two_backends
    url = service.gateway_url
    job_ids = [f"killed-llm-{i}" for i in range(JOBS)]
    reply = httpx.post(url + "/jobs", timeout=30, json=[
        {"job_id": job_id, "sampling_params": {"max_tokens": 32},
         "instance": {"data_source": "math", "problem": f"SLOWGEN {job_id}: what is 2 + 3?", "answer": "5"}}
        for job_id in job_ids])
    assert reply.status_code == 202, reply.text
    # every job's generation held at the doomed server, then a second backend, then the kill
    eventually(lambda: len(doomed.log()) >= JOBS, 60, "every job's request at the doomed backend")
    assert httpx.post(url + "/add_llm_server", json={"address": spare.address()}).status_code == 200
    os.kill(doomed.process.popen.pid, signal.SIGKILL)

    bodies = [result(url, job_id, wait_s=120).json() for job_id in job_ids]
    for body in bodies:
        attempts = [(a["outcome"], a["stage"]) for a in body["attempts"]]
        assert body["outcome"] == "ok" and body["reward"] == 1.0, (body["outcome"], attempts, body.get("detail"))
        assert attempts == [("backend_error", "run"), ("ok", None)], attempts
        assert body["backend"] == spare.address(), body["backend"]
    backends = {b["address"]: b for b in httpx.get(url + "/llm_servers").json()["servers"]}
    assert backends[doomed.address()]["healthy"] is False and backends[spare.address()]["healthy"], backends
    assert len(spare.log()) == JOBS  # one generation per job: the failed attempt's was never finished
    assert not service.dead(), service.dead()
