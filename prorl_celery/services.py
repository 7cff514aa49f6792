"""The objects every stage and view shares, built once from one ``Settings``.

The gateway's app factory makes its own ``Services(settings)`` and keeps it in
``app.extensions`` (``api.extension``); workers use this process's ``get_services()``, built
from the environment. Neither touches the handler registry: whoever starts a process configures
it (``handlers.registry.configure(settings.handlers, **settings.handler_options())``)
explicitly, in ``api.create_app`` and at
worker start-up (``prorl_celery.worker.signals``).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import redis
from redis import Redis

from prorl_celery.core.settings import Settings, get_settings
from prorl_celery.llm.pool import BackendPool
from prorl_celery.state.cancellation import CancelWatcher
from prorl_celery.state.connection import get_redis, reset_clients
from prorl_celery.state.group_commit import GroupCommit
from prorl_celery.state.journal import JournalStore
from prorl_celery.state.leases import LeaseKeeper
from prorl_celery.state.metrics import MetricsBuffer
from prorl_celery.state.store import JobRecord, JobStore

if TYPE_CHECKING:
    from celery import Celery

    from prorl_celery.wire.job_intake import JobSpec, Submitted
    from prorl_celery.worker.job_sandboxes import JobSandboxes


@dataclass
class Services:
    settings: Settings
    #: how long a Redis command retries a connection error (default: ``settings.redis_retry_s``,
    #: the workers'; the gateway passes its shorter ``gateway_redis_retry_s``)
    redis_retry_s: float | None = None

    @cached_property
    def redis(self) -> redis.Redis:
        return self.redis_for(self.settings.redis_url)

    @cached_property
    def broker_redis(self) -> Redis:
        """The broker's Redis, for reading queue depths and republishing lost messages."""
        return self.redis_for(self.settings.effective_broker_url)

    def redis_for(self, url: str) -> Redis:
        retry_s = self.settings.redis_retry_s if self.redis_retry_s is None else self.redis_retry_s
        return get_redis(url, retry_s=retry_s, master_name=self.settings.redis_sentinel_master,
                         sentinel_password=self.settings.redis_sentinel_password)

    @cached_property
    def celery(self) -> Celery:
        """A Celery app on ``settings``' broker, for publishing stages (the gateway's INIT).

        Workers publish through the app they run (``prorl_celery.celery_app.app``); this one
        lets an app factory given explicit settings enqueue where those settings say."""
        from celery.backends.base import DisabledBackend

        from prorl_celery.celery_app import create_celery  # Celery is loaded only where jobs are submitted
        app = create_celery(self.settings, set_as_current=False)
        if isinstance(app.backend, DisabledBackend):
            # Celery keeps its result backend and reply-to id per thread, which under the
            # gateway's gevent worker means per greenlet: every request built both anew (a
            # backend object and a uuid3, 6 % of a worker's CPU in a /process burst). Without a
            # result backend neither holds any state or connection, so one serves them all.
            from prorl_celery.worker._celery import share_backend
            share_backend(app)
        return app

    @cached_property
    def store(self) -> JobStore:
        return JobStore(self.redis, result_ttl_s=self.settings.result_ttl_s, lease_s=self.settings.lease_s)

    @cached_property
    def journal(self) -> JournalStore:
        return JournalStore(self.redis, max_events=self.settings.journal_max_events,
                            max_bytes=self.settings.journal_max_bytes)

    @cached_property
    def intake(self) -> GroupCommit[JobSpec, Submitted]:
        """The gateway's submits, concurrent ones grouped into one ``job_intake.submit`` call
        (:mod:`prorl_celery.state.group_commit`)."""
        from prorl_celery.wire import job_intake  # the handlers and Celery are loaded only where jobs are submitted
        return GroupCommit(lambda specs: job_intake.submit(
            self.store, specs, celery=self.celery, batch=self.settings.stage_batch,
            replicas=self.settings.redis_wait_replicas, replica_wait_ms=self.settings.redis_wait_timeout_ms))

    @cached_property
    def records(self) -> GroupCommit[str, JobRecord | None]:
        """The gateway's reads of job records, concurrent ones in one pipeline: the listener
        wakes the waiters of every job one stream read names at once, and each then reads its
        job's record (None: no such job)."""
        return GroupCommit(self.store.load_many)

    @cached_property
    def pool(self) -> BackendPool:
        return BackendPool(self.redis)

    @cached_property
    def cancel_watcher(self) -> CancelWatcher:
        return CancelWatcher(self.redis)

    @cached_property
    def sandboxes(self) -> JobSandboxes:
        from prorl_celery.worker.job_sandboxes import (
            JobSandboxes,  # the sandbox stack is only loaded by workers that use it
        )
        return JobSandboxes(self.redis, node=self.settings.node, runtime=self.settings.runtime,
                            root=self.settings.sandbox_dir)

    @cached_property
    def metrics(self) -> MetricsBuffer:
        return MetricsBuffer(self.redis)

    @cached_property
    def leases(self) -> LeaseKeeper:
        return LeaseKeeper(self.redis, self.settings.lease_s)

    def close(self) -> None:
        """Stop the background threads this object started (tests, embedding)."""
        for name in ("cancel_watcher", "metrics", "leases"):
            if name in self.__dict__:  # only what was ever created
                getattr(self, name).close()
        if "metrics" in self.__dict__:
            self.metrics.flush()
        if "store" in self.__dict__:
            self.store.close()  # the completion listener of an app's waits
        if "celery" in self.__dict__:
            self.celery.close()  # its broker connections and producer pool


_services: Services | None = None
_pid = 0
_lock = threading.Lock()


def get_services() -> Services:
    """This process's services, from the environment's settings (workers, the CLI); rebuilt
    after a fork so no socket or thread is shared."""
    global _services, _pid
    with _lock:
        if _services is None or _pid != os.getpid():
            if _pid and _pid != os.getpid():
                reset_clients()
            _services, _pid = Services(get_settings()), os.getpid()
        return _services
