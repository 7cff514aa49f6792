"""Celery's internals, patched here and nowhere else (pinned: ``TESTED_WITH``).

What is patched, and why:

- ``share_backend``: an app without a result backend keeps one backend object and one reply-to
  id for every thread (``app._backend_cache``, ``app._local``). Celery keeps both per thread,
  which under the gateway's gevent worker means per greenlet: every request built both anew,
  6 % of a gateway worker's CPU in a ``/process`` burst.
- ``call_after_each_task``: wraps the worker pool's ``on_apply`` so that a task's end (after
  its request left ``reserved_requests``) can wake the hub at once; a shut fetch gate otherwise
  idles a freed thread for about a second (40 % of INIT/EVAL's throughput).
- ``reserved_requests``: the worker's fetched and unfinished requests
  (``celery.worker.state.reserved_requests``), which the fetch gates count; ``reserved_snapshot``
  copies them without iterating a set other threads change.
- ``StageConsumer``: the worker's consumer, its broker reconnects on shorter waits than kombu's
  defaults, which Celery's consumer passes no setting for (see ``consumer_class``).

``tests/integration/test_library_internals.py`` fails, naming the version, on a Celery outside
``TESTED_WITH``, and checks that every attribute used here still exists.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

#: the Celery releases (major.minor) this module was written and measured against
TESTED_WITH = ("5.7",)


def share_backend(app: Any) -> None:
    """One result backend object and reply-to id for every thread of an app that has none."""
    app._backend_cache = app.backend
    app._local = SimpleNamespace(oid=app.thread_oid)


def reserved_requests() -> Any:
    """The worker's requests fetched and not yet finished."""
    from celery.worker import state
    return state.reserved_requests


def reserved_snapshot() -> list[Any]:
    """``reserved_requests`` as a list, copied in one step.

    The set is a ``WeakSet`` that the pool's threads take finished requests out of while the
    consumer's thread counts what it holds: iterating the live set then raises "Set changed
    size during iteration", which stopped a RUN worker's consumer (and so the worker) in a
    1,000-job burst. Copying the set of references underneath is one C call under the GIL, so
    no other thread runs in between; a reference whose request is gone is skipped."""
    refs = set(reserved_requests().data)
    return [request for request in (ref() for ref in refs) if request is not None]


def call_after_each_task(pool: Any, after: Callable[[], object]) -> None:
    """Make each task of ``pool`` call ``after`` once its completion callback returned. The pool
    outlives the consumer, which restarts after a lost broker connection: its own ``on_apply`` is
    wrapped each time, never the last wrapper."""
    original = pool.__dict__.setdefault("_prorl_on_apply", pool.on_apply)
    pool.on_apply = _calling_after_completion(original, after)


def _calling_after_completion(on_apply: Callable[..., Any], after: Callable[[], object]) -> Callable[..., Any]:
    """``pool.on_apply`` whose tasks call ``after`` once their completion callback (the request's
    ``on_success``/``on_failure``, which take it out of ``state.reserved_requests``) returned."""
    def apply(target: Any, args: Any = None, kwargs: Any = None, callback: Callable[..., Any] | None = None,
              **options: Any) -> Any:
        if callback is not None:
            done = callback

            def callback(*result: Any, **more: Any) -> None:
                try:
                    done(*result, **more)
                finally:
                    after()
        return on_apply(target, args, kwargs, callback=callback, **options)
    return apply




#: the broker reconnect's waits between rounds over every broker URL: from the first, growing
#: by the step, never above the last (kombu's own, which Celery's consumer uses: 2, 4, 6 ... 30 s)
RECONNECT_START_S, RECONNECT_STEP_S, RECONNECT_MAX_S = 0.5, 0.5, 2.0


def consumer_class() -> type:
    """Celery's worker consumer, reconnecting to a lost broker every ``RECONNECT_*`` seconds.

    Celery's consumer calls ``Connection.ensure_connection`` with kombu's default waits, and no
    setting changes them: after a Redis restart or a Sentinel failover a worker found the broker
    back only on its next round, up to 6 s later by the third, while the stages' own Redis
    commands (``PRORL_REDIS_RETRY_S``) had long gone on. Named by the ``worker_consumer`` setting
    (``celery_app.create_celery``)."""
    from celery.worker.consumer import Consumer

    class StageConsumer(Consumer):
        def ensure_connected(self, conn: Any) -> Any:
            return super().ensure_connected(with_fast_reconnect(conn))

    return StageConsumer


def with_fast_reconnect(conn: Any) -> Any:
    """``conn`` (a kombu Connection) whose ``ensure_connection`` waits ``RECONNECT_*``."""
    conn.ensure_connection = partial(type(conn).ensure_connection, conn, interval_start=RECONNECT_START_S,
                                     interval_step=RECONNECT_STEP_S, interval_max=RECONNECT_MAX_S)
    return conn


def __getattr__(name: str) -> Any:
    """``StageConsumer``, built on first use: the gateway imports this module too, and must not
    load Celery's worker for it."""
    if name == "StageConsumer":
        built = globals()["StageConsumer"] = consumer_class()
        return built
    raise AttributeError(name)
