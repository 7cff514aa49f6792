"""The baseline of ``bench.overhead``: a bare Celery three-queue chain of no-op tasks.

Three tasks on three queues (``raw_init``, ``raw_run``, ``raw_eval``) chained with
``celery.chain`` and waited on through a Redis result backend: the least a Celery pipeline of
three hand-overs can cost on this machine. Configured from the environment, so the client (the
benchmark) and the workers (started as
``python -m celery -A bench.raw_chain worker -Q raw_init -P threads -c N``) agree:

``RAW_CHAIN_BROKER_URL``     the broker (the benchmark gives it db 2 of its Redis server)
``RAW_CHAIN_RESULT_BACKEND`` the result backend (db 3)
``RAW_CHAIN_EVENTS``         "1" to send task events like the service's workers do (default off)

Broker transport and worker settings mirror ``prorl_celery.celery_app`` where they apply
(threads pool, prefetch multiplier 1, json, early ack, the same transport options). The values
are copied rather than imported: importing ``prorl_celery`` would connect the service's worker
start-up signals (heartbeat, node queue) in these workers too.
"""
from __future__ import annotations

import os
import threading
import time

from celery import Celery, chain, states
from celery.exceptions import TimeoutError as ResultTimeout
from celery.result import AsyncResult
from kombu import Queue

QUEUES = ("raw_init", "raw_run", "raw_eval")

BROKER_URL = os.environ.get("RAW_CHAIN_BROKER_URL", "redis://127.0.0.1:6379/2")
RESULT_BACKEND = os.environ.get("RAW_CHAIN_RESULT_BACKEND", "redis://127.0.0.1:6379/3")
EVENTS = os.environ.get("RAW_CHAIN_EVENTS", "0") == "1"

# prorl_celery.celery_app's transport options (visibility timeout = its default, 60 s)
TRANSPORT = {
    "visibility_timeout": 60,
    "socket_timeout": 30,
    "socket_connect_timeout": 10,
    "socket_keepalive": True,
    "health_check_interval": 30,
}

app = Celery("raw_chain", broker=BROKER_URL, backend=RESULT_BACKEND)
app.conf.update(
    task_queues=[Queue(name) for name in QUEUES],
    task_default_queue=QUEUES[0],
    task_routes={f"raw.{name.removeprefix('raw_')}": {"queue": name} for name in QUEUES},
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    worker_pool="threads",
    worker_concurrency=16,
    worker_hijack_root_logger=False,
    worker_send_task_events=EVENTS,
    task_send_sent_event=EVENTS,
    broker_transport_options=TRANSPORT,
    result_backend_transport_options=TRANSPORT,
    broker_connection_retry_on_startup=True,
    broker_pool_limit=64,
)


@app.task(name="raw.init")
def raw_init(payload):
    return payload


@app.task(name="raw.run")
def raw_run(payload):
    return payload


@app.task(name="raw.eval")
def raw_eval(payload):
    return payload


def submit(payload) -> AsyncResult:
    """Send one three-stage chain; the result is the last task's."""
    return chain(raw_init.s(payload), raw_run.s(), raw_eval.s()).apply_async()


_missed = 0
_missed_lock = threading.Lock()


def late_wakeups() -> int:
    """Waits that ran past ``recheck_s`` and then found the result already stored.

    With ``recheck_s`` far above a job's latency these are wake-ups pub/sub lost.
    """
    return _missed


def _count_missed_wakeup() -> None:
    global _missed
    with _missed_lock:
        _missed += 1


def run_one(payload, timeout_s: float = 60.0, recheck_s: float = 1.0):
    """One job end to end: send the chain and block until its last task's result arrives.

    ``.get()`` waits on the result backend's pub/sub channel. Under heavy concurrent use that
    wake-up is occasionally lost (the result is stored but ``get`` never returns until its
    timeout; seen here about once in 10^4 chains with 16 client threads on a loaded machine,
    compare celery issues #3761, #4670); rather than hang for ``timeout_s``, every ``recheck_s``
    the stored result is read directly, and such a rescue is counted (``late_wakeups()``).
    """
    result = submit(payload)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return result.get(timeout=max(0.01, min(recheck_s, left)), disable_sync_subtasks=False)
        except ResultTimeout:
            meta = result.backend.get_task_meta(result.id)
            if meta["status"] == states.SUCCESS:
                _count_missed_wakeup()
                return meta["result"]
            if time.monotonic() >= deadline:
                chain_states = [r.backend.get_task_meta(r.id)["status"] for r in _lineage(result)]
                raise ResultTimeout(f"raw chain {result.id} not done after {timeout_s:.0f} s; "
                                    f"task states init..eval: {chain_states}") from None


def _lineage(result: AsyncResult) -> list[AsyncResult]:
    line = []
    while result is not None:
        line.append(result)
        result = result.parent
    return line[::-1]
