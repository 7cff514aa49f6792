"""Stage leases: a job whose worker died mid-stage is retried or ends as ``failed``, never hangs.

A stage's lease starts when it is claimed (``status_at``) and is renewed every ``lease_s / 3``
by a thread of the worker process executing it. One reaper at a time (a Redis lock with a TTL,
so a dead reaper's lock lapses) ends every job in an executing status whose lease has run out,
and every node-local job waiting in ``run.<node>`` for a node that has no live RUN worker any
more (its node died or was cut off: nobody else may consume that queue). A stage that comes
back after being reaped finds the job moved on: its transitions are no-ops.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

import redis

from . import keys
from .nodes import live_queues
from .status import JobStatus, Stage
from .store import JobStore, load_script

log = logging.getLogger(__name__)
EXECUTING = frozenset(stage.value for stage in Stage)


class LeaseKeeper:
    """Renews the leases of the stages this process is executing."""

    def __init__(self, client: redis.Redis, lease_s: float) -> None:
        self.redis = client
        self.lease_s = lease_s
        self._renew = load_script(client, "renew_leases")
        self._jobs: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, job_id: str) -> None:
        with self._lock:
            self._jobs[job_id] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prorl-leases", daemon=True)
                self._thread.start()

    def release(self, job_id: str) -> None:
        with self._lock:
            self._jobs[job_id] -= 1
            if self._jobs[job_id] <= 0:
                del self._jobs[job_id]

    def held(self) -> list[str]:
        """Ids of the jobs whose stages this process is executing."""
        with self._lock:
            return list(self._jobs)

    def renew_now(self) -> int:
        with self._lock:
            held = [keys.job(job_id) for job_id in self._jobs]
        return int(self._renew(keys=held, args=[self.lease_s])) if held else 0

    def close(self) -> None:
        """Stop the background thread."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew_now()
            except redis.RedisError as error:
                log.warning("lease renewal failed: %s", error)


def expired_jobs(store: JobStore, lease_s: float) -> list[tuple[str, Stage]]:
    """Jobs in an executing status whose lease ran out, with the stage they were in."""
    job_ids = store.active_job_ids()
    if not job_ids:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(keys.job(job_id), ["status", "status_at", "lease_until"])
    now = store.server_time()
    expired = []
    for job_id, (status, status_at, lease_until) in zip(job_ids, pipe.execute()):
        if status not in EXECUTING or not status_at:
            continue
        deadline = max(float(status_at) + lease_s, float(lease_until or 0))
        if deadline < now:
            expired.append((job_id, Stage(status)))
    return expired


#: fields of an attempt that a retry from INIT starts without
RETRY_RESET = {"init_result": None, "run_result": None, "trajectory": None, "sandbox": None,
               "backend": "", "critical_error": "", "error": None, "run_queue": "",
               "init_node": "", "run_node": "", "eval_node": ""}


def stranded_jobs(store: JobStore, live: set[tuple[str, str]]) -> list[str]:
    """Jobs waiting in ``run.<node>`` whose node has no live worker on that queue: the node that
    ran their INIT (and holds their sandbox) is gone, so no RUN will ever claim them."""
    job_ids = store.active_job_ids()
    if not job_ids:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(keys.job(job_id), ["status", "run_queue", "init_node"])
    return [job_id for job_id, (status, queue, node) in zip(job_ids, pipe.execute())
            if status == JobStatus.PENDING_RUN.value and queue and (node, queue) not in live]


def give_up(store: JobStore, job_id: str, stage: Stage, reason: str,
            retry: Callable[[str], None] | None = None, *, status: JobStatus | None = None) -> bool:
    """Take a job away from the attempt executing ``stage`` (or, with ``status``, waiting in
    it): retry it from INIT while its ``attempt`` is below its ``max_attempts``
    (``retry(job_id)`` enqueues INIT), else end it as ``failed``. Attempt-guarded, so that
    attempt's own stage can no longer move the job."""
    status = status or stage.active
    attempt, max_attempts = (int(v or 1) for v in store.redis.hmget(keys.job(job_id), ["attempt", "max_attempts"]))
    if retry is not None and attempt < max_attempts:
        moved = store.transition(job_id, JobStatus.PENDING_INIT, timer="pause", only_from=status,
                                 attempt=attempt, fields={**RETRY_RESET, "attempt": attempt + 1, "retry_reason": reason})
        if moved.ok:
            log.warning("job %s: %s; retrying from INIT (attempt %d)", job_id, reason, attempt + 1)
            retry(job_id)
        return moved.ok
    ended = store.transition(job_id, JobStatus.FAILED, timer="pause", only_from=status, attempt=attempt,
                             fields={"critical_error": stage.value, "error": reason})
    if ended.ok:
        log.warning("job %s: %s", job_id, reason)
    return ended.ok


def reap_expired(store: JobStore, lease_s: float, retry: Callable[[str], None] | None = None,
                 heartbeat_s: float | None = None) -> list[str]:
    """Give up every job whose stage lost its worker, and (given ``heartbeat_s``) every job
    stranded in a dead node's RUN queue (see ``give_up``); returns their ids."""
    reaped = []
    for job_id, stage in expired_jobs(store, lease_s):
        reason = f"worker lost during {stage.value}: its lease expired (no heartbeat for {lease_s:.0f} s)"
        if give_up(store, job_id, stage, reason, retry):
            reaped.append(job_id)
    if heartbeat_s is not None:
        for job_id in stranded_jobs(store, live_queues(store.redis, heartbeat_s)):
            reason = "node lost while the job waited for RUN: no live RUN worker on its INIT node"
            if give_up(store, job_id, Stage.RUN, reason, retry, status=JobStatus.PENDING_RUN):
                reaped.append(job_id)
    return reaped


class Reaper:
    """Runs ``reap_expired`` every ``interval_s`` in one process of the cluster at a time, and
    ``every_tick`` (node-local duties) in every process."""

    def __init__(self, store: JobStore, owner: str, *, lease_s: float, interval_s: float,
                 retry: Callable[[str], None] | None = None,
                 on_reaped: Callable[[list[str]], None] = lambda job_ids: None,
                 every_tick: Callable[[], object] = lambda: None, heartbeat_s: float | None = None) -> None:
        self.store, self.owner, self.retry, self.heartbeat_s = store, owner, retry, heartbeat_s
        self.on_reaped, self.every_tick = on_reaped, every_tick
        self.lease_s, self.interval_s = lease_s, interval_s
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="prorl-reaper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.every_tick()  # node-local duties of every worker (sandboxes of dead owners)
                lock_s = max(1, int(self.interval_s * 2))
                if self.store.redis.set(keys.REAPER_LOCK, self.owner, nx=True, ex=lock_s) or \
                        self.store.redis.get(keys.REAPER_LOCK) == self.owner:
                    self.store.redis.expire(keys.REAPER_LOCK, lock_s)
                    reaped = reap_expired(self.store, self.lease_s, self.retry, self.heartbeat_s)
                    if reaped:
                        self.on_reaped(reaped)
            except Exception as error:  # noqa: BLE001 - the reaper must keep running
                log.warning("reaper: %s", error)
