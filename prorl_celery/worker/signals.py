"""Worker life-cycle hooks.

Start-up: configure and import the handlers, reap the node's sandboxes of dead owners, add ``run.<node>`` to a
RUN worker's queues; when ready: the heartbeat ``/status`` reports and the lease reaper. SIGTERM:
hand back stages that outlive the grace period. Shutdown: leave the worker list.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown, worker_shutting_down
from redis.typing import EncodableT, FieldT

from handlers import load_handlers, registry
from prorl_celery.celery_app import enqueue, enqueue_many, node_queue
from prorl_celery.core.event_loops import configure_stage_loop, stage_loop
from prorl_celery.core.status import Stage
from prorl_celery.services import get_services
from prorl_celery.state import keys
from prorl_celery.state.leases import Reaper, give_up
from prorl_celery.state.nodes import STALE_BEATS, drain_asked, record_beat
from prorl_celery.worker.draining import DrainSwitch, held_stages, software_versions
from prorl_celery.worker.readiness import refused_tasks
from singularity.runtime import reap_exited_children

if TYPE_CHECKING:
    from prorl_celery.services import Services
    from prorl_celery.worker.warm_pool import WarmPool

log = logging.getLogger(__name__)
_stop = threading.Event()
_worker_name: dict[str, str] = {}
#: task -> what this worker lacks to run it (``readiness.refused_tasks``, at start-up)
_refused: dict[str, list[str]] = {}
#: this INIT worker's warm pool, once started (``PRORL_WARM_POOL_SIZE`` > 0)
_warm_pool: list[WarmPool] = []


def _retry_from_init(job_id: str) -> None:
    enqueue(Stage.INIT, job_id)


def _republish(stage: Stage, job_ids: list[str]) -> None:
    """The stage messages the reaper found lost, published as the stage's own are (one per job)."""
    enqueue_many(stage, job_ids)


#: Celery's two INFO lines per task ("received", "succeeded in"), six per job: about a tenth of
#: a short stage's CPU, while the job store already records every stage (status, times, node).
#: Task failures (ERROR) still show; ``-l debug`` shows the lines again.
TASK_LINE_LOGGERS = ("celery.app.trace", "celery.worker.strategy")


def _quiet_task_lines() -> None:
    for name in TASK_LINE_LOGGERS:
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(logging.DEBUG):
            logger.setLevel(logging.WARNING)


@celeryd_after_setup.connect
def add_node_queue(sender: str, instance, **_: object) -> None:
    """A RUN worker also consumes ``run.<node>``, so plain ``-Q run`` serves node-local jobs."""
    _quiet_task_lines()  # before the consumer builds its task strategies (they read the level once)
    settings = get_services().settings
    registry.configure(settings.handlers, **settings.handler_options())  # PRORL_HANDLERS, before any lookup
    load_handlers()  # import every task family now, not during the first job (sympy: 0.5 s)
    _refused.update(refused_tasks())  # logged; reported with the heartbeat, so /status names them
    _reap_sandboxes()
    queues = instance.app.amqp.queues
    if Stage.EVAL.value in queues.consume_from:
        _preload_graders()
    if Stage.RUN.value in queues.consume_from:
        name = node_queue(Stage.RUN, get_services().settings.node)
        queues.select_add(name)
        log.info("RUN worker %s also consumes %s", sender, name)
        # RUN stages are long and uneven (whole conversations): a RUN worker whose threads are
        # all busy must not hold a fetched message another worker could start now (INIT and
        # EVAL workers: celery_app.StageFetchGate, which wakes the hub as a task ends; Celery's
        # setting alone re-polls a full threads pool only once a second).
        instance.app.conf.worker_disable_prefetch = True
        # every RUN stage of the process runs on one event loop; -c threads only admit them
        slots = get_services().settings.run_slots or instance.concurrency
        configure_stage_loop(slots)
        log.info("RUN worker %s runs up to %d RUN stages at once on one event loop", sender, slots)


@worker_ready.connect
def start_heartbeat(sender, **_: object) -> None:
    consumer = sender
    worker_name = consumer.hostname
    queues = sorted(consumer.app.amqp.queues.consume_from)
    concurrency = getattr(consumer.controller, "concurrency", None) if hasattr(consumer, "controller") else None
    services = get_services()
    if Stage.INIT.value in queues and services.settings.warm_pool_size > 0:
        _start_warm_pool()
    if Stage.RUN.value in queues:
        _probe_backends(services)
    switch = DrainSwitch(consumer, queues)
    thread = threading.Thread(target=_beat, args=(worker_name, queues, concurrency, switch),
                              name="prorl-heartbeat", daemon=True)
    thread.start()
    Reaper(services.store, f"{worker_name}:{os.getpid()}", lease_s=services.settings.lease_s,
           interval_s=services.settings.reaper_interval_s,
           retry=_retry_from_init,
           on_reaped=lambda job_ids: services.metrics.count("lease_expiries", len(job_ids)),
           every_tick=_run_worker_tick if Stage.RUN.value in queues else _reap_sandboxes,
           heartbeat_s=services.settings.heartbeat_s,
           broker=services.broker_redis, republish=_republish,
           republish_after_s=services.settings.republish_after_s,
           on_republished=lambda job_ids: services.metrics.count("republished_messages", len(job_ids))).start()


def _probe_backends(services: Services) -> None:
    """Every registered backend, probed before this RUN worker takes a job: after a restart the
    pool in Redis may list a server that is gone as healthy."""
    try:
        down = {address: health.detail for address, health in
                services.pool.probe_all(timeout_s=services.settings.backend_probe_timeout_s).items()
                if not health.healthy}
    except Exception as error:  # noqa: BLE001 - the reaper's re-probe and RUN's own marking remain
        log.warning("cannot probe the registered LLM backends: %s", error)
        return
    for address, detail in down.items():
        log.warning("LLM backend %s does not answer; out of routing until it does (%s)", address, detail)


@worker_shutting_down.connect
def hand_back_on_shutdown(**_: object) -> None:
    """SIGTERM (Slurm's warning before SIGKILL): Celery stops taking jobs and waits for running
    stages; those still running after the grace period are handed back (retried from INIT while
    attempts remain, else failed) and aborted, which closes their sandboxes and backends."""
    stage_loop().close()  # RUN messages not yet claimed go back to the queue
    if _warm_pool:
        _warm_pool[0].stop_refilling()
    threading.Thread(target=_hand_back_after_grace, name="prorl-shutdown", daemon=True).start()


def _hand_back_after_grace() -> None:
    services = get_services()
    deadline = time.monotonic() + services.settings.shutdown_grace_s
    while services.leases.held() and time.monotonic() < deadline:
        time.sleep(0.1)
    for job_id in services.leases.held():
        status = services.store.status(job_id)
        if status is None or status.stage is None or status != status.stage.active:
            continue
        reason = f"worker shut down during {status.value}"
        give_up(services.store, job_id, status.stage, reason, retry=_retry_from_init)
        services.cancel_watcher.wake(job_id)


@worker_shutdown.connect
def stop_heartbeat(**_: object) -> None:
    _drain_stage_loop()
    _stop.set()
    _close_warm_pool()
    try:
        redis = get_services().redis
        redis.zrem(keys.WORKERS, _worker_name.get("name", ""))
    except Exception:  # noqa: BLE001 - shutting down anyway
        pass


#: after the grace period, time the handed-back RUN stages get to close their sandboxes
ABORT_S = 15.0


def _drain_stage_loop() -> None:
    """Celery's warm shutdown waits for its pool threads, but RUN stages run on the stage loop:
    keep the process alive until they end (they finish, or are handed back after the grace
    period by ``hand_back_on_shutdown`` and abort), as a threads pool worker would."""
    loop = stage_loop()
    if loop.busy and not loop.wait_idle(get_services().settings.shutdown_grace_s + ABORT_S):
        log.warning("%d RUN stages still running at exit; their leases will expire", loop.busy)
    if loop.started:
        from prorl_celery.llm.backends import close_http_client
        try:
            loop.call(close_http_client(), timeout_s=5)
        except Exception as error:  # noqa: BLE001 - exiting anyway
            log.warning("cannot close the LLM HTTP session: %s", error)


def _start_warm_pool() -> None:
    """An INIT worker with ``PRORL_WARM_POOL_SIZE`` > 0 keeps ready sandboxes for its jobs."""
    from prorl_celery.worker.warm_pool import WarmPool, parse_presets
    services = get_services()
    settings = services.settings
    pool = WarmPool(services.sandboxes, size=settings.warm_pool_size, max_mb=settings.warm_pool_max_mb,
                    presets=parse_presets(settings.warm_pool_images), count=services.metrics.count,
                    paused=lambda: not services.store.service_started())
    services.sandboxes.pool = pool
    _warm_pool.append(pool)
    pool.start()
    log.info("warm pool: %d ready sandboxes per kind, at most %.0f MB", settings.warm_pool_size,
             settings.warm_pool_max_mb)


def _close_warm_pool() -> None:
    if _warm_pool:
        try:
            _warm_pool[0].close()
        except Exception as error:  # noqa: BLE001 - the node's reaper stops what is left
            log.warning("cannot close the warm pool: %s", error)


def _reap_sandboxes() -> None:
    """Stop the sandboxes on this node whose owner died (at start-up and on every reaper tick)."""
    try:
        reap_exited_children()  # this process's own exited sandbox roots: no zombie outlives a tick
        sandboxes = get_services().sandboxes
        sandboxes.reap()
        sandboxes.reap_untracked()
    except Exception as error:  # noqa: BLE001 - a worker must start even if reaping fails
        log.warning("cannot reap sandboxes of dead workers: %s", error)


def _run_worker_tick() -> None:
    """A RUN worker's tick: its node's sandboxes, then the unhealthy LLM backends due for a probe
    (from where jobs talk to them; one probe per backend per interval across the cluster)."""
    _reap_sandboxes()
    services = get_services()
    try:
        services.pool.reprobe(_worker_name.get("name", str(os.getpid())),
                              timeout_s=services.settings.backend_probe_timeout_s,
                              interval_s=services.settings.backend_probe_interval_s)
    except Exception as error:  # noqa: BLE001 - the reaper's other duties go on
        log.warning("cannot re-probe unhealthy LLM backends: %s", error)


#: libraries that graders import on first use: an EVAL worker imports them at start-up, so its
#: first job does not wait for them (math_verify: sympy, 0.5 s), while the gateway, INIT and RUN
#: workers never carry them (40 MB)
EVAL_PRELOAD = ("math_verify",)


def _preload_graders() -> None:
    for name in EVAL_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as error:  # a handler that needs it will say so on its first job
            log.warning("cannot preload %s: %s", name, error)


def _preload_tokenizer(path: str) -> None:
    """Load the default tokenizer before the first job needs it (seconds for large vocabularies)."""
    from prorl_celery.llm.tokenizer import load_tokenizer
    try:
        load_tokenizer(path)
    except Exception as error:  # noqa: BLE001 - the first job will report it properly
        log.warning("cannot preload tokenizer %s: %s", path, error)


def _beat(name: str, queues: list[str], concurrency: int | None, switch: DrainSwitch) -> None:
    _worker_name["name"] = name
    services = get_services()
    node = services.settings.node
    if services.settings.tokenizer and Stage.RUN.value in queues:
        _preload_tokenizer(services.settings.tokenizer)
    info: dict[FieldT, EncodableT] = {"node": node, "queues": ",".join(queues), "pid": os.getpid(),
                                      "concurrency": concurrency or "", "refused": json.dumps(_refused),
                                      "versions": json.dumps(software_versions())}
    while not _stop.is_set():
        if _warm_pool:
            info["warm_pool"] = json.dumps(_warm_pool[0].stats())
        try:
            # the drain first, so that a beat saying "draining" comes after the queues stopped
            switch.apply(drain_asked(services.redis, node))
            info["draining"] = "1" if switch.applied else "0"
            info["busy"] = held_stages(services.redis, services.leases.held())
            pipe = services.redis.pipeline(transaction=False)
            pipe.hset(keys.worker(name), mapping=info)
            pipe.expire(keys.worker(name), max(1, int(services.settings.heartbeat_s * STALE_BEATS)))
            now = time.time()
            pipe.zadd(keys.WORKERS, {name: now})
            record_beat(pipe, node, now)
            pipe.execute()
        except Exception as error:  # noqa: BLE001 - a missed beat only ages the entry
            log.warning("heartbeat failed: %s", error)
        _stop.wait(services.settings.heartbeat_s)
