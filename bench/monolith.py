"""The baseline of ``bench.scale``'s pipeline comparison: one worker does a job's INIT, RUN and
EVAL itself, in sequence, as a single Celery task.

It runs the very same handler (:mod:`bench.scale_handler`) through the same LLM path as the
service's RUN stage (backend taken from a :class:`~prorl_celery.llm.pool.BackendPool`, a
token-in/token-out session from ``pipeline.open_session``); only the three-queue hand-over is
missing. Configured from the environment so that the client (the benchmark) and the workers
(``python -m celery -A bench.monolith worker -Q mono -P threads -c 1``) agree:

``MONO_BROKER_URL``     the broker (``bench.scale`` gives it db 2 of its Redis server)
``MONO_RESULT_BACKEND`` the result backend (db 4)
``PRORL_REDIS_URL``     the job state this baseline's services use (db 3: its backend pool)
"""
from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from kombu import Queue

BROKER_URL = os.environ.get("MONO_BROKER_URL", "redis://127.0.0.1:6379/2")
RESULT_BACKEND = os.environ.get("MONO_RESULT_BACKEND", "redis://127.0.0.1:6379/4")
QUEUE = "mono"

app = Celery("monolith", broker=BROKER_URL, backend=RESULT_BACKEND)
app.conf.update(
    task_queues=[Queue(QUEUE)], task_default_queue=QUEUE, task_serializer="json", result_serializer="json",
    accept_content=["json"], task_acks_late=False, worker_prefetch_multiplier=1, worker_pool="threads",
    worker_hijack_root_logger=False, broker_transport_options={"visibility_timeout": 60},
    result_backend_transport_options={"visibility_timeout": 6 * 3600}, broker_connection_retry_on_startup=True,
)


@app.task(name="mono.job")
def job(job_id: str, instance: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    from prorl_celery.core.event_loops import run_coro
    return run_coro(_job(job_id, instance, sampling))


async def _job(job_id: str, instance: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    from handlers import JobContext, get_handler, registry
    from prorl_celery.services import get_services
    from prorl_celery.worker.pipeline import open_session

    services = get_services()
    # PRORL_HANDLERS names the scalebench handler
    registry.configure(services.settings.handlers, **services.settings.handler_options())
    handler = get_handler("scalebench")
    context = JobContext(job_id=job_id, task="scalebench", instance=instance, sampling_params=sampling)
    started = time.time()
    context.init_result = await handler.init(context)
    assignment = services.pool.acquire()
    if assignment is None:
        raise RuntimeError("no LLM backend registered in the baseline's pool")
    try:
        context.run_result = await handler.run(context, open_session(services, context, assignment))
    finally:
        services.pool.release(assignment.address)
    outcome = await handler.eval(context)
    return {"job_id": job_id, "reward": outcome.reward, "turns": context.run_result.get("turns"),
            "started": started, "finished": time.time()}
