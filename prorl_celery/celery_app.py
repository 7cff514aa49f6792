"""The Celery application: three stage queues on a Redis broker, tuned for long tasks."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

from celery import Celery, bootsteps
from celery.utils.nodenames import anon_nodename
from kombu import Producer, Queue
from kombu.utils.uuid import uuid

from prorl_celery.core.settings import Settings, get_settings
from prorl_celery.core.status import Stage
from prorl_celery.state.connection import broker_ssl_options, is_sentinel
from prorl_celery.state.store import SENT_HEADER, UNCLAIMED_STAGES
from prorl_celery.worker._celery import call_after_each_task, reserved_requests, reserved_snapshot
from prorl_celery.worker._kombu import RedisTransport, SentinelTransport, fetch_gate, set_fetch_gate, transport_for

STAGE_QUEUES = tuple(stage.value for stage in Stage)
#: the queues workers consume without acks (see StageFetchGate and leases.republish_lost)
UNACKED_QUEUES = frozenset(stage.value for stage in UNCLAIMED_STAGES)


def node_queue(stage: Stage, node: str) -> str:
    """The queue only ``stage`` workers on ``node`` consume (container locality)."""
    return f"{stage.value}.{node}"


class RunSlotGate(bootsteps.StartStopStep):
    """A RUN worker fetches a message only while a slot of its stage loop is free for it.

    Its RUN tasks return as soon as their stage is admitted to the loop, so Celery's own limit
    (``worker_disable_prefetch``: no more fetched-but-unfinished tasks than ``-c``) would let
    it take ``-c`` messages more than it can run and sit on them; this one counts the stages
    running on the loop too. It wraps the channel's ``can_consume`` as that setting does.

    While the gate is shut the consumer sends no BRPOP and sleeps in its hub's poller until the
    next timer, about a second: a slot freed meanwhile idled that long, a second per stage
    whenever stages outnumber slots (``python -m bench.slots``). So a freed slot wakes the hub
    (its thread-safe ``call_soon``), whose next turn re-checks the gate and sends the BRPOP at
    once; the ack of a RUN task (acks_late) wakes it the same way once its request leaves
    ``reserved``. The message is still only taken once a slot is free for it.

    A message may carry a chunk of jobs (``PRORL_STAGE_BATCH``): the fetched ones count by their
    jobs, and a chunk larger than the slots free takes those and sends the rest back
    (``tasks.run_stage``)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent) -> None:
        if Stage.RUN.value not in parent.app.amqp.queues.consume_from or parent.task_consumer is None:
            return
        from prorl_celery.core.event_loops import stage_loop
        loop = stage_loop(get_settings().run_slots or parent.controller.concurrency)
        qos = parent.task_consumer.channel.qos
        # reserved: fetched and not yet admitted (or an INIT/EVAL task of a mixed worker),
        # counted in jobs: a chunk of four waiting for its slots leaves no room for another
        fetch_allowed = fetch_gate(qos)
        set_fetch_gate(qos, lambda: loop.free() > _jobs_in(reserved_snapshot()) and fetch_allowed())
        hub = parent.hub
        if hub is not None:  # without a hub (synloop: green pools) the consumer polls every 2 s as before
            loop.on_release(partial(hub.call_soon, _next_turn))


class StageFetchGate(bootsteps.StartStopStep):
    """A worker consuming a queue without acks (INIT, EVAL: ``UNACKED_QUEUES``) fetches a
    message only while a pool thread is free for it.

    kombu's prefetch limit counts the deliveries awaiting an ack, and these have none: without
    this gate the worker would BRPOP its whole queue into its buffer, where another worker
    cannot reach it and where it is lost if the worker dies. ``state.reserved_requests`` holds the
    fetched and unfinished requests (a chunk of ``PRORL_STAGE_BATCH`` jobs is one request: it
    runs on one thread), so the gate is open while they are fewer than the pool's threads: at
    most one message per free thread leaves the queue, and it starts at once. It wraps the
    channel's ``can_consume`` as ``worker_disable_prefetch`` does, and beside ``RunSlotGate``
    in a mixed worker (``-Q init,run``), where a fetch needs both a free thread and, for the RUN
    stages that may come, a free slot: BRPOP takes from whichever queue has a message.

    A shut gate sends no BRPOP and the hub sleeps until its next timer, about a second
    (why ``worker_disable_prefetch`` cost INIT/EVAL 40 % of their throughput): so the end of a
    task wakes the hub (``call_soon``, thread-safe) once the request has left ``reserved``, when
    the gate was found shut (``_ThreadGate``), and the freed thread fetches its next message at
    once."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent) -> None:
        queues = parent.app.amqp.queues
        if parent.task_consumer is None or not any(
                getattr(queues.get(name), "no_ack", False) for name in queues.consume_from):
            return

        def threads() -> int:  # Celery's own limit for worker_disable_prefetch (autoscaler first)
            return getattr(parent.controller, "max_concurrency", None) or parent.pool.num_processes

        qos = parent.task_consumer.channel.qos
        hub, pool = parent.hub, parent.pool
        gate = _ThreadGate(lambda: len(reserved_requests()) < threads(), fetch_gate(qos),
                           partial(hub.call_soon, _next_turn) if hub is not None else lambda: None)
        set_fetch_gate(qos, gate.can_consume)
        if hub is not None and pool is not None:
            # the pool outlives the consumer, which restarts (a new channel, a new gate) after a
            # lost broker connection: wrap its own on_apply each time, never the last wrapper
            call_after_each_task(pool, gate.task_done)


class _ThreadGate:
    """``can_consume`` while a thread is free, and the wake-up of a hub that found it shut.

    A task's end wakes the hub only if the gate was last found shut, so a worker with threads
    to spare pays no extra hub turn per task. No wake-up is lost: the hub marks itself
    ``waiting`` before it reads ``reserved``, and a task checks the mark after its request left
    ``reserved``; so either the hub read saw the free thread, or the task sees the mark."""

    def __init__(self, thread_free: Callable[[], bool], fetch_allowed: Callable[[], bool],
                 wake: Callable[[], object]) -> None:
        self._thread_free, self._fetch_allowed, self._wake = thread_free, fetch_allowed, wake
        self.waiting = False

    def can_consume(self) -> bool:  # the hub's thread
        self.waiting = True
        if self._thread_free() and self._fetch_allowed():
            self.waiting = False
            return True
        return False

    def task_done(self) -> None:  # a pool thread, once its request left reserved
        if self.waiting:
            self.waiting = False
            self._wake()


def _jobs_in(requests) -> int:
    """The jobs that fetched stage messages carry (a chunk's ids, or one)."""
    return sum(len(r.args[0]) if r.args and isinstance(r.args[0], list) else 1 for r in requests)


def _next_turn() -> None:
    """Nothing to do: being called wakes the hub, whose turn re-checks the gate (the transport's
    ``on_poll_start``) and sends the BRPOP if a slot is free."""


def create_celery(settings: Settings | None = None, *, set_as_current: bool = True) -> Celery:
    """The stage queues' Celery app on ``settings``' broker (default: the environment's)."""
    settings = settings or get_settings()
    # workers import the signal handlers (prorl_celery.worker.signals) with the tasks, before the
    # start-up signals fire; nothing else that imports the app loads them
    app = Celery("prorl_celery", broker=settings.effective_broker_url,
                 include=["prorl_celery.worker.tasks", "prorl_celery.worker.signals"], set_as_current=set_as_current)
    app.steps["consumer"].add(RunSlotGate)
    app.steps["consumer"].add(StageFetchGate)
    transport: dict[str, Any] = {
        # RUN messages are acked once admitted, so only fetched-but-not-admitted ones are unacked
        # (INIT and EVAL have no acks): a killed RUN worker's come back after this, and a copy
        # still waiting in a live worker's buffer becomes a no-op through the stage claim
        "visibility_timeout": settings.visibility_timeout_s,
        # kombu sweeps for them every interval x throttle seconds (100 s by default): make it a
        # few seconds, so they return within about the visibility timeout
        "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_s // 4)),
        "unacked_restore_throttle": 1,
        "unacked_restore_limit": 1000,
        "socket_timeout": 30,
        "socket_connect_timeout": 10,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
    if is_sentinel(settings.effective_broker_url):
        # kombu's Sentinel channel: the primary's name, and the sentinels' own password
        transport["master_name"] = settings.redis_sentinel_master
        sentinels: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 5}
        if settings.redis_sentinel_password is not None:
            sentinels["password"] = settings.redis_sentinel_password
        transport["sentinel_kwargs"] = sentinels
    app.conf.update(
        # INIT and EVAL without acks: their stages are acked when they start anyway, and the ack
        # emulation cost two Redis round trips per message; StageFetchGate keeps a worker from
        # hoarding them, and the reaper publishes again a message lost between fetch and claim
        # (leases.republish_lost). RUN keeps its acks (acked once admitted: run_stage).
        task_queues=[Queue(name, no_ack=name in UNACKED_QUEUES) for name in STAGE_QUEUES],
        task_default_queue=Stage.INIT.value,
        task_routes={f"prorl.{name}": {"queue": name} for name in STAGE_QUEUES},
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # results live in the job store, not in a Celery backend
        # stages are acked when they start: a re-run would repeat side effects (sandboxes), and
        # the stage claim in the job store already turns any redelivery into a no-op
        task_acks_late=False,
        worker_prefetch_multiplier=1,  # a busy worker must not hoard long jobs
        # worker_disable_prefetch only on RUN workers (prorl_celery.worker.signals): with the threads
        # pool a full worker then re-polls only once a second, which cost the pipeline 40 % of
        # its throughput on short INIT/EVAL stages; INIT/EVAL workers have StageFetchGate, the
        # same limit with the hub woken as each task ends
        worker_pool="threads",  # stages wait on I/O; each thread runs its own event loop
        worker_concurrency=16,
        worker_hijack_root_logger=False,
        # events cost 4 Redis publishes per stage (a fifth of a worker's CPU on short stages):
        # off unless asked; Flower switches them on at run time, or start workers with -E
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        broker_transport_options=transport,
        broker_transport=transport_for(settings.effective_broker_url),
        broker_use_ssl=broker_ssl_options(settings.effective_broker_url),
        broker_connection_retry_on_startup=True,
        # a lost broker is tried again every 0.5-2 s, not kombu's 2, 4, 6 ... s (worker._celery)
        worker_consumer="prorl_celery.worker._celery:StageConsumer",
        broker_pool_limit=64,
    )
    return app


app = create_celery()


#: about 30 s of publish retries (kombu reconnects between them)
PUBLISH_RETRY = {"max_retries": 60, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


#: what a stage message carries: one job id, or a chunk of them (``PRORL_STAGE_BATCH``)
Payload = str | list[str]

#: a stage message's body after its args: no kwargs, and no callbacks, chain or chord
_NO_KWARGS: dict[str, Any] = {}
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
#: the headers every stage message shares (``amqp.as_task_v2``'s, for a task sent with no options)
_HEADERS: dict[str, Any] = {
    "lang": "py", "shadow": None, "eta": None, "expires": None, "group": None, "group_index": None, "retries": 0,
    "parent_id": None, "kwargsrepr": "{}", "ignore_result": True, "replaced_task_nesting": 0,
    "stamped_headers": None}
_origin: tuple[int, str] = (0, "")


def _origin_name() -> str:
    """Celery's ``origin`` header (``gen<pid>@<host>``), computed once per process (a forked
    gunicorn worker gets its own)."""
    global _origin
    pid = os.getpid()
    if _origin[0] != pid:
        _origin = (pid, anon_nodename())
    return _origin[1]


def _send(sender: Celery, producer: Producer, stage: Stage, queue: str | None, payload: Payload,
          **retry: Any) -> None:
    """Publish one stage message: the Celery protocol-2 task message ``send_task`` would build
    (same headers, body and properties; a worker consumes it unchanged), without what
    ``send_task`` does around it for options stage tasks never use (routing, signature
    options, ``saferepr``, result bookkeeping, retry wrapping): 0.4x its CPU per message in a batch,
    0.7x alone (``python -m bench.publish``). With ``task_send_sent_event`` on (``PRORL_TASK_EVENTS``) it
    is ``send_task`` itself, whose task-sent event Flower shows."""
    name, target = f"prorl.{stage.value}", queue or stage.value
    if sender.conf.task_send_sent_event:
        sender.send_task(name, args=[payload], queue=target, producer=producer, declare=_declare(sender, target),
                         headers={SENT_HEADER: time.time()}, **retry)
        return
    task_id = uuid()
    args = [payload]
    headers = {**_HEADERS, "task": name, "id": task_id, "root_id": task_id, "origin": _origin_name(),
               "argsrepr": repr(args)[:sender.amqp.argsrepr_maxsize], "timelimit": [None, None], "stamps": {},
               SENT_HEADER: time.time()}
    producer.publish(json.dumps((args, _NO_KWARGS, _EMBED)), routing_key=target, exchange="", headers=headers,
                     content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                     declare=_declare(sender, target), correlation_id=task_id, reply_to="", **retry)


def enqueue(stage: Stage, job_id: Payload, *, queue: str | None = None, celery: Celery | None = None) -> None:
    """Hand a job (or a chunk of jobs, one message) to ``stage``'s queue (or a node's own queue
    of that stage).

    The job has already been handed over in the store: a message lost here would strand it
    in ``pending_<stage>`` for good, so publishing outlasts a Redis restart (Celery's default
    gives up after 0.6 s). ``celery``: publish through that app instead of this module's."""
    sender = celery or app
    try:
        # one attempt without kombu's retry wrapper first (a sixth of a publish's CPU); a failure
        # is sent again with retries: a copy that got through twice is a no-op by the stage claim
        with sender.producer_or_acquire() as producer:
            _send(sender, producer, stage, queue, job_id)
    except Exception:  # noqa: BLE001 - the broker blinked: retried below
        with sender.producer_or_acquire() as producer:
            _send(sender, producer, stage, queue, job_id, retry=True, retry_policy=PUBLISH_RETRY)


def _declare(sender: Celery, queue: str) -> list[Queue]:
    """What a publish declares: nothing on our Redis transport, where a stage message goes
    straight to its queue's list (the anonymous exchange) and the consuming workers declare
    their queues; the queue elsewhere (kombu declares it once per channel), as ``send_task``
    would."""
    return [] if sender.conf.broker_transport in (RedisTransport, SentinelTransport) else [sender.amqp.queues[queue]]


def pack(job_ids: list[str], batch: int) -> list[Payload]:
    """``job_ids`` as message payloads of at most ``batch`` ids; a lone id stays a plain id (the
    message every single-job path sends)."""
    if batch <= 1:
        return list(job_ids)
    chunks = [job_ids[i:i + batch] for i in range(0, len(job_ids), batch)]
    return [chunk[0] if len(chunk) == 1 else chunk for chunk in chunks]


#: one message to publish: its stage, its queue (None: the stage's shared one) and its payload
Message = tuple[Stage, str | None, Payload]


def pack_messages(jobs: Sequence[tuple[Stage, str | None, str, Hashable | None]], batch: int) -> list[Message]:
    """The messages for ``jobs``, each ``(stage, queue, job id, share key)``: jobs of one stage,
    queue and share key in chunks of at most ``batch`` ids, a job whose key is None alone."""
    groups: dict[tuple[Stage, str | None, Hashable | None], list[str]] = {}
    for stage, queue, job_id, key in jobs:
        groups.setdefault((stage, queue, key), []).append(job_id)
    return [(stage, queue, payload) for (stage, queue, key), job_ids in groups.items()
            for payload in pack(job_ids, batch if key is not None else 1)]


def publish(messages: list[Message], *, celery: Celery | None = None) -> None:
    """Publish ``messages`` over one producer, their LPUSHes sent in one pipeline (kombu's
    ``Producer.batch``): half the CPU per message of publishing them one by one.

    A batch that fails is sent again message by message with ``enqueue``'s retries: a message
    that got through twice is harmless, the stage claim turns the copy into a no-op."""
    if len(messages) <= 1:
        for stage, queue, payload in messages:
            enqueue(stage, payload, queue=queue, celery=celery)
        return
    sender = celery or app
    try:
        with sender.producer_or_acquire() as producer, producer.batch():
            for stage, queue, payload in messages:
                _send(sender, producer, stage, queue, payload)
    except Exception:  # noqa: BLE001 - the broker blinked: fall back to retried publishes
        for stage, queue, payload in messages:
            enqueue(stage, payload, queue=queue, celery=celery)


def enqueue_many(stage: Stage, job_ids: list[str], *, queue: str | None = None, batch: int = 1,
                 celery: Celery | None = None) -> None:
    """``enqueue`` for many jobs in one pipelined round trip (``publish``), packed into messages
    of at most ``batch`` ids (1: a message per job). Only jobs whose handler lists ``stage`` in
    its ``batched_stages`` may share a message (``AgentHandler.shares_messages``)."""
    publish([(stage, queue, payload) for payload in pack(job_ids, batch)], celery=celery)
