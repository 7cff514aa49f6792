"""Stage functions called in-process (no Celery) on a real Redis: paths a cluster can't stage."""
from __future__ import annotations

import redis

from handlers import registry
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.services import Services
from prorl_celery.worker.pipeline import execute_stage


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
