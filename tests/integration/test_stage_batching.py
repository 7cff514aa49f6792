"""Stage messages that carry several jobs (``PRORL_STAGE_BATCH``, ``AgentHandler.batched_stages``).

Publishing is checked against a real redis-server broker, the messages read off its lists: a
submit packs the INIT messages of jobs whose handler allows it into chunks, never a job whose
INIT starts a sandbox, and a batch of 1 is a message per job. Executing is checked on a cluster
of its own (real gunicorn, Celery workers and Redis, ``PRORL_STAGE_BATCH=4``), its consumers
paused (Celery's remote control) while the messages are counted: an INIT chunk with a cancelled
job, a job whose handler raises and one that crashes ends each alone and the others complete;
a RUN chunk larger than the worker's free slots takes the free ones and sends the rest back as
one message.
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import socket
import time

import pytest
import redis
from celery import Celery

from prorl_celery.celery_app import create_celery
from prorl_celery.core.event_loops import StageLoop
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from prorl_celery.state import keys
from prorl_celery.state.store import JobStore
from prorl_celery.wire.job_intake import JobSpec, submit
from tests.support.services import ROOT, Gateway, eventually

DB = 11
BATCH = 4
SLOTS = 3


def payloads(broker: redis.Redis, queue: str) -> list[str | list[str]]:
    """What each message in ``queue`` carries (its one argument), oldest first."""
    messages = [json.loads(raw) for raw in reversed(broker.lrange(queue, 0, -1))]  # LPUSHed
    return [json.loads(base64.b64decode(m["body"]))[0][0] for m in messages]


# -- publishing ------------------------------------------------------------------------------------

@pytest.fixture
def intake(redis_url):
    url = f"{redis_url}/{DB}"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    app = create_celery(Settings(redis_url=url, broker_url=url), set_as_current=False)
    yield JobStore(client, result_ttl_s=600), app, redis.Redis.from_url(url)
    app.close()
    client.flushdb()


def spec(job_id: str, task: str, **instance) -> JobSpec:
    return JobSpec(job_id, task, {"problem": "1+1", "answer": "2", **instance}, {}, {"tokenizer": "t"}, [], 60.0, 1)


def test_a_submit_packs_init_messages_per_task_and_never_one_that_starts_a_sandbox(intake):
    store, app, broker = intake
    plain = [spec(f"m{i}", "math") for i in range(10)]
    with_tools = [spec(f"t{i}", "math", tools=["python"]) for i in range(2)]  # INIT starts a sandbox
    code = [spec(f"c{i}", "code") for i in range(3)]  # a sandbox handler: never batched
    submit(store, [*plain[:5], *with_tools, *code, *plain[5:]], celery=app, batch=BATCH)
    sent = payloads(broker, Stage.INIT.value)
    assert len(sent) == 5 + math.ceil(10 / BATCH)
    assert sorted(p for p in sent if isinstance(p, str)) == ["c0", "c1", "c2", "t0", "t1"]
    assert [p for p in sent if isinstance(p, list)] == [["m0", "m1", "m2", "m3"], ["m4", "m5", "m6", "m7"],
                                                        ["m8", "m9"]]


def test_a_batch_of_one_is_a_message_per_job(intake):
    store, app, broker = intake
    submit(store, [spec(f"m{i}", "math") for i in range(6)], celery=app, batch=1)
    assert payloads(broker, Stage.INIT.value) == [f"m{i}" for i in range(6)]
    submit(store, [spec("m9", "math")], celery=app, batch=BATCH)  # a chunk of one is a plain message
    assert payloads(broker, Stage.INIT.value)[-1] == "m9"


# -- executing -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def batch_cluster(qwen3_tokenizer, tmp_path_factory) -> LocalCluster:
    handlers = "fault=tests.support.handlers:FaultHandler,bfault=tests.support.batching:BatchedFaultHandler"
    env = {"PRORL_HANDLERS": handlers,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_STAGE_BATCH": str(BATCH), "PRORL_RUN_SLOTS": str(SLOTS), "PRORL_LEASE_S": "3",
           "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_VISIBILITY_TIMEOUT_S": "10", "PRORL_SHUTDOWN_GRACE_S": "1",
           "PRORL_NODE": f"batch-{os.getpid()}"}
    local = LocalCluster(redis_url=None, tokenizer=qwen3_tokenizer, env=env, gateway_workers=1,
                         concurrency={Stage.INIT: 2, Stage.RUN: 4, Stage.EVAL: 2},
                         log_dir=tmp_path_factory.mktemp("batch-cluster"))
    with local:
        yield local


@pytest.fixture
def service(batch_cluster):
    redis.Redis.from_url(batch_cluster.state_url).flushdb()
    control = create_celery(Settings(redis_url=batch_cluster.state_url, broker_url=batch_cluster.broker_url),
                            set_as_current=False)
    paused = Paused(batch_cluster, control)
    with Gateway(batch_cluster) as client:
        yield client, paused, redis.Redis.from_url(batch_cluster.broker_url)
    for stage in list(paused.stages):  # a failed test must not leave the next one without consumers
        paused.resume(stage)
    control.close()


class Paused:
    """Stops and restarts a stage's worker consuming its queue (Celery's remote control), so
    that the messages sent meanwhile can be read off the broker."""

    def __init__(self, cluster: LocalCluster, control: Celery) -> None:
        self.cluster, self.control, self.stages = cluster, control, set[Stage]()

    def worker(self, stage: Stage) -> list[str]:
        return [f"{p.name}@{socket.gethostname()}" for p in self.cluster.processes
                if p.name.startswith(f"{stage.value}-")]

    def pause(self, stage: Stage) -> None:
        workers = self.worker(stage)
        replies = self.control.control.cancel_consumer(stage.value, destination=workers, reply=True, timeout=5,
                                                       limit=len(workers))
        assert replies and all("ok" in reply for answer in replies for reply in answer.values()), replies
        self.stages.add(stage)
        time.sleep(1.5)  # a BRPOP sent before the cancel still takes a message; it times out after 1 s

    def resume(self, stage: Stage) -> None:
        workers = self.worker(stage)
        self.control.control.add_consumer(stage.value, destination=workers, reply=True, timeout=5, limit=len(workers))
        self.stages.discard(stage)


def submit_many(client: Gateway, instances: list[dict]) -> list[str]:
    response = client.post("/jobs", json=[{"instance": instance} for instance in instances])
    assert response.status_code == 202, response.text
    return [job["job_id"] for job in response.json()["jobs"]]


def statuses(cluster: LocalCluster, job_ids: list[str]) -> list[str | None]:
    state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    return [state.hget(keys.job(job_id), "status") for job_id in job_ids]


def test_an_init_chunk_ends_a_cancelled_a_failing_and_a_crashing_job_alone(service):
    client, control, broker = service
    control.pause(Stage.INIT)
    job_ids = submit_many(client, [{"data_source": "bfault", "reward": 0.5},
                                   {"data_source": "bfault", "fail": "init"},
                                   {"data_source": "bfault", "crash": "init"},
                                   {"data_source": "bfault", "reward": 0.25},
                                   {"data_source": "bfault"}, {"data_source": "bfault"}])
    assert payloads(broker, Stage.INIT.value) == [job_ids[:4], job_ids[4:]]
    assert client.post("/cancel", json={"job_ids": [job_ids[3]]}).json()["cancelled"] == [job_ids[3]]
    control.resume(Stage.INIT)
    results = [client.result(job_id, wait=30) for job_id in job_ids]
    assert [r["status"] for r in results] == ["completed", "failed", "failed", "cancelled", "completed", "completed"]
    assert results[0]["reward"] == 0.5 and results[4]["eval"] == {"ran": True}
    assert results[1]["critical_error"] == "init" and "scripted failure in init" in results[1]["error"]
    assert results[2]["critical_error"] == "init" and "crashed" in results[2]["error"]
    init_log = "".join(p.log_path.read_text() for p in client.cluster.processes if p.name.startswith("init-"))
    assert f"init of job {job_ids[3]} skipped: job is JobStatus.CANCELLED" in init_log  # by its claim


def test_a_run_chunk_takes_the_free_slots_and_sends_the_rest_back_as_one_message(service):
    client, control, broker = service
    cluster = client.cluster
    control.pause(Stage.RUN)
    job_ids = submit_many(client, [{"data_source": "bfault", "run_sleep_s": 2} for _ in range(BATCH)])
    eventually(lambda: statuses(cluster, job_ids) == ["pending_run"] * BATCH, 15, "all four waiting for RUN")
    assert payloads(broker, Stage.RUN.value) == [job_ids]  # the INIT chunk handed over as one RUN chunk
    control.resume(Stage.RUN)
    eventually(lambda: statuses(cluster, job_ids).count("run") == SLOTS, 10, "three RUN stages running")
    # the fourth went back to the queue as a message of its own, not held by the full worker
    eventually(lambda: payloads(broker, Stage.RUN.value) == [job_ids[SLOTS]], 5, "the rest re-published")
    assert statuses(cluster, job_ids)[SLOTS] == "pending_run"
    results = [client.result(job_id, wait=30) for job_id in job_ids]
    assert [r["status"] for r in results] == ["completed"] * BATCH


def test_a_handler_that_does_not_opt_in_gets_a_message_per_job_in_every_stage(service):
    client, control, broker = service
    for stage in (Stage.INIT, Stage.RUN, Stage.EVAL):
        control.pause(stage)
    job_ids = submit_many(client, [{"data_source": "fault"} for _ in range(3)])
    assert payloads(broker, Stage.INIT.value) == job_ids
    control.resume(Stage.INIT)
    eventually(lambda: sorted(payloads(broker, Stage.RUN.value)) == sorted(job_ids), 15, "three RUN messages")
    control.resume(Stage.RUN)
    eventually(lambda: sorted(payloads(broker, Stage.EVAL.value)) == sorted(job_ids), 15, "three EVAL messages")
    control.resume(Stage.EVAL)
    assert [client.result(job_id, wait=30)["status"] for job_id in job_ids] == ["completed"] * 3


def test_a_batch_submit_of_math_jobs_is_a_message_per_chunk_and_every_job_completes(service, llm_servers):
    client, control, broker = service
    server = llm_servers[0]
    assert client.post("/add_llm_server", json={"address": server.address()}).status_code == 200
    control.pause(Stage.INIT)
    count = 10
    job_ids = submit_many(client, [{"data_source": "math", "problem": "What is 2 + 3?", "answer": "5",
                                    "trajectory_id": i} for i in range(count)])
    sent = payloads(broker, Stage.INIT.value)
    assert len(sent) == math.ceil(count / BATCH) and sorted(sum(sent, [])) == sorted(job_ids)
    control.resume(Stage.INIT)
    results = [client.result(job_id, wait=30) for job_id in job_ids]
    assert [(r["status"], r["reward"]) for r in results] == [("completed", 1.0)] * count
    assert [r["trajectory_id"] for r in results] == list(range(count))


def test_a_chunk_is_admitted_to_the_free_slots_only_and_a_skipped_stage_frees_its_own():
    loop = StageLoop(3, name="test-admit-many")
    hold = asyncio.Event()

    async def held() -> None:
        await hold.wait()

    try:
        assert loop.admit(lambda _: held())
        asked: list[int] = []

        def start(_: asyncio.AbstractEventLoop, n: int) -> list:
            asked.append(n)
            return [held(), None][:n]  # the second was skipped (a redelivery): its slot is free again

        assert loop.admit_many(5, start) == 2 and asked == [2]
        assert loop.busy == 2 and loop.free() == 1
        loop.call(_set(hold), timeout_s=5)
        assert loop.wait_idle(5)
    finally:
        loop.close()


async def _set(event: asyncio.Event) -> None:
    event.set()
