"""Wake the stages of cancelled jobs at once.

One listener thread per worker process subscribes to the cancel channel and sets the asyncio
event of every local stage watching that job. Pub/sub is only the fast path: watching starts
before the stage's claim (which reads the job's status), each (re)subscription is followed by a
sweep of every watched job (a cancel published while no subscription was live is found then),
and a slow sweep every ``sweep_s`` covers a connection that died without telling us.

A sweep costs one command however many stages are watched: ``SMISMEMBER`` on the set of jobs
not yet ended; only the watched jobs that left it (few: they ended) have their status read.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import redis

from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys

log = logging.getLogger(__name__)


class CancelWatcher:
    def __init__(self, client: redis.Redis, sweep_s: float = 2.0) -> None:
        self.redis = client
        self.sweep_s = sweep_s
        self._watched: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, job_id: str, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """An event, set on ``loop`` when ``job_id`` is cancelled from now on.

        Register before the stage claims the job: the claim then covers any earlier cancel.
        """
        self._ensure_started()
        event = asyncio.Event()
        with self._lock:
            self._watched.setdefault(job_id, []).append((loop, event))
        return event

    def unwatch(self, job_id: str, event: asyncio.Event) -> None:
        with self._lock:
            entries = [e for e in self._watched.get(job_id, []) if e[1] is not event]
            if entries:
                self._watched[job_id] = entries
            else:
                self._watched.pop(job_id, None)

    def wake(self, job_id: str) -> None:
        """Abort this process's stages of ``job_id`` (as a cancel would)."""
        with self._lock:
            entries = list(self._watched.get(job_id, []))
        for loop, event in entries:
            loop.call_soon_threadsafe(event.set)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._listen, name="prorl-cancel", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the listener thread (within one sweep period)."""
        self._stop.set()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.redis.pubsub()
                pubsub.subscribe(keys.CANCEL_CHANNEL)
                next_sweep = float("inf")  # once subscribed: every cancel from then on reaches us
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=min(self.sweep_s, max(0.0, next_sweep - time.monotonic())))
                    if message and message["type"] == "subscribe":
                        next_sweep = time.monotonic()  # the cancels of the gap before it: found now
                    elif message and message["type"] == "message":
                        self.wake(message["data"])
                    if time.monotonic() >= next_sweep:
                        self._sweep()
                        next_sweep = time.monotonic() + self.sweep_s
            except redis.RedisError as error:
                if not self._stop.is_set():
                    log.warning("cancel listener lost Redis (%s); reconnecting", error)
                self._stop.wait(1.0)

    def _sweep(self) -> None:
        with self._lock:
            job_ids = list(self._watched)
        if not job_ids:
            return
        active = self.redis.smismember(keys.ACTIVE_JOBS, job_ids)
        ended = [job_id for job_id, is_active in zip(job_ids, active) if not is_active]
        if not ended:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ended:
            pipe.hget(keys.job(job_id), "status")
        for job_id, status in zip(ended, pipe.execute()):
            if status in (None, JobStatus.CANCELLED.value):
                self.wake(job_id)
