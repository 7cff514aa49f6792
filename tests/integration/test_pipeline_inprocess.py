"""Stage functions called in-process (no Celery) on a real Redis: paths a cluster can't stage."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from handlers import registry
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.services import Services
from prorl_celery.worker.pipeline import execute_stage

ROOT = Path(__file__).resolve().parents[2]


def test_node_local_job_without_a_run_worker_on_its_node_fails_instead_of_stranding(redis_url):
    # a short heartbeat: INIT waits two of them for a RUN worker to show up before it fails
    settings = Settings(redis_url=redis_url + "/7", node="lonely-node", heartbeat_s=0.5,
                        handlers="localfault=tests.support.handlers:LocalFaultHandler")
    redis.Redis.from_url(settings.redis_url).flushdb()
    registry.configure(settings.handlers, **settings.handler_options())
    services = Services(settings)
    services.store.create("j1", {"task": "localfault", "instance": {}, "budget_s": 10})
    try:
        execute_stage(Stage.INIT, "j1", services)  # waits two heartbeats (1 s) for a RUN worker
    finally:
        registry.configure("")
        services.close()
    record = services.store.load("j1")
    assert (record.status, record.critical_error) == (JobStatus.FAILED, "init")
    assert "no live RUN worker on node lonely-node" in (record.error or "")
    assert services.store.wait("j1", 0).terminal


def test_a_task_unknown_to_the_worker_fails_at_once_with_the_reason(redis_url):
    settings = Settings(redis_url=redis_url + "/7")
    redis.Redis.from_url(settings.redis_url).flushdb()
    services = Services(settings)
    services.store.create("j2", {"task": "not-installed-here", "instance": {}, "budget_s": 10})
    try:
        execute_stage(Stage.INIT, "j2", services)
    finally:
        services.close()
    record = services.store.load("j2")
    assert (record.status, record.critical_error) == (JobStatus.FAILED, "init")
    assert "cannot run the task" in (record.error or "") and "not-installed-here" in (record.error or "")


HAND_OVER_PROBE = """
import json, time
import redis
from handlers import registry
from prorl_celery.core.settings import get_settings
from prorl_celery.core.status import Stage
from prorl_celery.services import Services
from prorl_celery.state import keys
from prorl_celery.worker.pipeline import execute_stage

settings = get_settings()  # PRORL_* below: the module's Celery app publishes to the same Redis
client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
client.flushdb()
registry.configure(settings.handlers, **settings.handler_options())
services = Services(settings)
# node-b's INIT worker, as its heartbeat writes it (prorl_celery.worker.signals)
client.hset(keys.worker("init@b"), mapping={"node": "node-b", "queues": "init"})
client.zadd(keys.WORKERS, {"init@b": time.time()})
services.store.create("j3", {"task": "fault", "instance": {}, "budget_s": 10, "attempt": 2, "max_attempts": 2,
                             "avoid_node": "node-a"})
seen = []
for _ in range(2):
    execute_stage(Stage.INIT, "j3", services)
    record = services.store.load("j3")
    seen.append([record.status.value, record.deferred_attempt, record.init_node,
                 client.llen(keys.broker_queue("init"))])
services.close()
print(json.dumps(seen))
"""


def test_a_retry_s_init_hands_itself_once_to_another_node(redis_url):
    """Attempt 2 of a job whose attempt 1 failed on node-a, claimed by node-a while an INIT
    worker of node-b is alive: put back in the init queue once (node-b's idle worker, waiting
    longest in BRPOP, takes it); claimed by node-a again, it runs there. In a process of its
    own: the stage publishes through the Celery app its environment configures."""
    url = redis_url + "/7"
    env = {**os.environ, "PRORL_REDIS_URL": url, "PRORL_BROKER_URL": url, "PRORL_NODE": "node-a",
           "PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", HAND_OVER_PROBE], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    handed_back, ran_here = json.loads(done.stdout.strip().splitlines()[-1])
    status, deferred, _, queued = handed_back
    assert (status, deferred, queued) == ("pending_init", 2, 1)  # back in the queue, for another node
    assert ran_here[:3] == ["pending_run", 2, "node-a"]  # this node's second claim: it runs it
