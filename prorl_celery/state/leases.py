"""Stage leases: a job whose worker died mid-stage is retried or ends as ``failed``, never hangs.

A stage's lease starts when it is claimed and is renewed every ``lease_s / 3`` by a thread of
the worker process executing it. One reaper at a time (a Redis lock with a TTL, so a dead
reaper's lock lapses) ends every job in an executing status whose lease has run out, and every
node-local job waiting in ``run.<node>`` for a node that has no live RUN worker any more (its
node died or was cut off: nobody else may consume that queue). A stage that comes back after
being reaped finds the job moved on: its transitions are no-ops.

The reaper reads indexes, never every active job (rq's ``StartedJobRegistry``): the claim
(``transition.lua``) and each renewal (``renew_leases.lua``) score the job by its lease
deadline in ``keys.LEASES``, and a tick asks only for the deadlines already past. A job in
``pending_run`` is listed under its queue (``keys.waiting_run``); a tick looks only into the
queues of nodes with no live RUN worker (the shared ``run`` queue's set is not listed among
the queues: no node of its own can die). Both are moved by the transition script itself, so a
job is never in a status without its entry. Jobs written by a version without the indexes are
indexed by ``backfill``, which the reaper runs when it takes the lock and whenever the indexes
disagree with the status counters (``index_drift``, a few commands): an older worker still
running in a rolling upgrade is caught too.

Lost INIT and EVAL messages. Those queues are consumed without acks (``celery_app``: a worker
fetches a message only for a free thread and claims it at once), so a message can leave its
queue and never be claimed: its worker died between the BRPOP and the claim. A publisher that
dies between handing a job over (``pending_init``, ``pending_eval``) and publishing leaves the
same hole, acks or not. The claim is the only consumer-side record, so the reaper looks from the
job side: ``keys.unclaimed(status)`` scores each job in those statuses by when it entered
(Redis time; moved by ``create_job.lua`` and ``transition.lua``, mended by ``backfill``), and
each stage message carries when it was sent (``store.SENT_HEADER``, its publisher's clock).
A job in its status for longer than ``PRORL_REPUBLISH_AFTER_S`` is published again only if its
stage's queue is empty or the queue's oldest message was sent more than ``REPUBLISH_MARGIN_S``
after the job entered (``lost_messages``). Why that never takes a job whose message is queued:
the transition comes before the publish, and the publish ends within enqueue's retries, so the
message is pushed after the job entered and was sent (publisher's clock) at most the margin
after; the queue is pushed at one end and popped at the other, so while that message is in it
the oldest one was pushed no later and sent no later than entry + margin (one list per
priority; each is checked). So a job behind a backlog is never published again, and a lost one
is once the backlog ahead of it has drained. A job published again is re-scored as if it had
entered then, so it is not taken again while its new message waits (no worker, say); and
should a message come back that the rule took for lost (a publisher retrying longer than the
margin, a clock further off than it), its copy is a no-op through the stage claim. A message
without the header (an older version's) may be older than any job: nothing is published again
while it is the oldest.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import redis

from prorl_celery.core.outcomes import Ending, Outcome
from prorl_celery.core.status import EXECUTING, WAITING_ON_NODE, JobStatus, Stage
from prorl_celery.state import keys
from prorl_celery.state.nodes import live_queues
from prorl_celery.state.store import (
    SENT_HEADER,
    UNCLAIMED_STAGES,
    JobStore,
    index_spec,
    load_script,
    outcome,
    retry_fields,
)

log = logging.getLogger(__name__)
#: most jobs a tick takes from each index: one tick stays bounded however many have expired
#: (the rest are next tick's)
REAP_BATCH = 1000
#: job ids per backfill script call: the backfill never blocks Redis for long
BACKFILL_BATCH = 500
#: a backfill that the counters ask for runs at most this often
BACKFILL_MIN_INTERVAL_S = 60.0
_EXECUTING_VALUES = frozenset(status.value for status in EXECUTING)
_EXECUTING = json.dumps(sorted(_EXECUTING_VALUES))
_scripts: weakref.WeakKeyDictionary[JobStore, dict[str, Any]] = weakref.WeakKeyDictionary()


def _script(store: JobStore, name: str) -> Any:
    """The store's client's copy of a script, registered once per store."""
    loaded = _scripts.setdefault(store, {})
    if name not in loaded:
        loaded[name] = load_script(store.redis, name)
    return loaded[name]


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
            held = list(self._jobs)
        if not held:
            return 0
        return int(self._renew(keys=[keys.LEASES, *(keys.job(job_id) for job_id in held)],
                               args=[self.lease_s, _EXECUTING, *held]))

    def close(self) -> None:
        """Stop the background thread."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew_now()
            except redis.RedisError as error:
                log.warning("lease renewal failed: %s", error)


def expired_jobs(store: JobStore, lease_s: float, limit: int = REAP_BATCH) -> list[tuple[str, Stage]]:
    """Jobs in an executing status whose lease ran out, with the stage they were in: at most
    ``limit``, from the lease index (only the entries whose deadline has passed are read)."""
    now = store.server_time()
    # decode_responses clients (the services'): str, whatever redis-py's stubs allow
    job_ids = cast(list[str], store.redis.zrangebyscore(keys.LEASES, "-inf", now, start=0, num=limit))
    if not job_ids:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(keys.job(job_id), ["status", "status_at", "lease_until"])
    expired, later, stale = [], {}, []
    for job_id, (status, status_at, lease_until) in zip(job_ids, pipe.execute()):
        if status not in _EXECUTING_VALUES or not status_at:
            stale.append(job_id)  # left behind by a version without the index
            continue
        # the record decides, as before the index: a reaper with a longer lease than the
        # claiming worker's waits for its own
        deadline = max(float(status_at) + lease_s, float(lease_until or 0))
        if deadline < now:
            expired.append((job_id, Stage(status)))
        else:
            later[job_id] = deadline
    if later:  # XX: never re-adds a job that left meanwhile; GT: never shortens a renewal
        store.redis.zadd(keys.LEASES, later, xx=True, gt=True)
    if stale:
        reindex(store, stale, lease_s)
    return expired


def stranded_jobs(store: JobStore, live: set[tuple[str, str]], limit: int = REAP_BATCH,
                  lease_s: float | None = None) -> list[str]:
    """Jobs waiting in ``run.<node>`` whose node has no live worker on that queue: the node that
    ran their INIT (and holds their sandbox) is gone, so no RUN will ever claim them. At most
    ``limit``; only the queues of such nodes are looked into."""
    # queue -> node: one entry per node, not per job
    queues = cast(dict[str, str], store.redis.hgetall(keys.WAITING_RUN_QUEUES))
    dead = [queue for queue, node in queues.items() if queue != Stage.RUN.value and (node, queue) not in live]
    if not dead:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for queue in dead:
        pipe.srandmember(keys.waiting_run(queue), limit)
    candidates = [(queue, job_id) for queue, job_ids in zip(dead, pipe.execute()) for job_id in job_ids][:limit]
    for _, job_id in candidates:
        pipe.hmget(keys.job(job_id), ["status", "run_queue", "init_node"])
    stranded, stale = [], []
    for (listed_in, job_id), (status, queue, node) in zip(candidates, pipe.execute()):
        if status != WAITING_ON_NODE.value or queue != listed_in:
            stale.append((listed_in, job_id))
        elif (node, queue) not in live:
            stranded.append(job_id)
    for queue in {queue for queue, _ in stale}:
        reindex(store, [job_id for listed_in, job_id in stale if listed_in == queue],
                store.lease_s if lease_s is None else lease_s, queue=queue)
    return stranded


def reindex(store: JobStore, job_ids: Iterable[str], lease_s: float, *, queue: str = "") -> int:
    """Put each job into the indexes its record says it belongs to and out of the others (see
    ``lua/reindex_jobs.lua``); ``queue``: the waiting set the ids were read from. Atomic per
    batch, so a job moving meanwhile keeps its entries. Returns the entries added or removed."""
    script = _script(store, "reindex_jobs")
    spec = index_spec(lease_s)
    changed = 0
    for batch in _batches(job_ids, BACKFILL_BATCH):
        changed += int(script(keys=[keys.LEASES, keys.WAITING_RUN_QUEUES, *map(keys.job, batch)],
                              args=[spec, queue, *batch]))
    return changed


def backfill(store: JobStore, lease_s: float) -> int:
    """Index every active job the indexes miss (written by a version without them), and drop
    every entry no record supports. O(active jobs), in batches: for start-up and repairs only."""
    changed = reindex(store, store.redis.sscan_iter(keys.ACTIVE_JOBS, count=BACKFILL_BATCH), lease_s)
    changed += reindex(store, (job_id for job_id, _ in store.redis.zscan_iter(keys.LEASES, count=BACKFILL_BATCH)),
                       lease_s)
    # the node queues listed, and the shared queue, which is not (no node to lose)
    queues = {Stage.RUN.value, *cast(list[str], store.redis.hkeys(keys.WAITING_RUN_QUEUES))}
    for queue in sorted(queues):
        changed += reindex(store, store.redis.sscan_iter(keys.waiting_run(queue), count=BACKFILL_BATCH),
                           lease_s, queue=queue)
    for stage in UNCLAIMED_STAGES:  # entries whose job left meanwhile without the script (or expired)
        changed += reindex(store, (job_id for job_id, _ in store.redis.zscan_iter(
            keys.unclaimed(stage.pending.value), count=BACKFILL_BATCH)), lease_s)
    return changed


def index_drift(store: JobStore) -> tuple[int, int]:
    """(jobs in an executing status - lease entries, jobs in pending_run - waiting entries), read
    at one instant: (0, 0) when the indexes hold exactly the jobs the status counters count."""
    return index_drifts(store)[:2]


def index_drifts(store: JobStore) -> tuple[int, int, int]:
    """``index_drift`` and, third, jobs in pending_init or pending_eval - their index entries
    (``keys.unclaimed``), all read at one instant."""
    counted_executing, indexed, counted_waiting, listed, counted_unclaimed, unclaimed = _script(store, "index_drift")(
        keys=[keys.STATUS_COUNTS, keys.LEASES, keys.WAITING_RUN_QUEUES], args=[index_spec(store.lease_s)])
    return (int(counted_executing) - int(indexed), int(counted_waiting) - int(listed),
            int(counted_unclaimed) - int(unclaimed))


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def give_up(store: JobStore, job_id: str, stage: Stage, reason: str,
            retry: Callable[[str], None] | None = None, *, status: JobStatus | None = None) -> bool:
    """Take a job away from the attempt executing ``stage`` (or, with ``status``, waiting in
    it): a lost worker or node is the environment's failure (``env_error``), so the job is
    retried from INIT while its ``attempt`` is below its ``max_attempts`` (``retry(job_id)``
    enqueues INIT), else ended as ``failed``. Attempt-guarded, so that attempt's own stage can no
    longer move the job."""
    status = status or stage.active
    raw = cast(list[str | None], store.redis.hmget(keys.job(job_id), ["attempt", "max_attempts", "attempts", "node"]))
    attempt, max_attempts = int(raw[0] or 1), int(raw[1] or 1)
    history, node = raw[2], raw[3]
    ending = Ending(Outcome.ENV_ERROR, stage.value, reason)
    if retry is not None and attempt < max_attempts:
        fields = retry_fields(json.loads(history) if history else [], attempt, ending, node)
        moved = store.transition(job_id, JobStatus.PENDING_INIT, timer="pause", only_from=status,
                                 attempt=attempt, fields=fields)
        if moved.ok:
            log.warning("job %s: %s; retrying from INIT (attempt %d)", job_id, reason, attempt + 1)
            retry(job_id)
        return moved.ok
    ended = store.transition(job_id, JobStatus.FAILED, timer="pause", only_from=status, attempt=attempt,
                             fields=outcome(stage.value, reason, ending))
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
        for job_id in stranded_jobs(store, live_queues(store.redis, heartbeat_s), lease_s=lease_s):
            reason = "node lost while the job waited for RUN: no live RUN worker on its INIT node"
            if give_up(store, job_id, Stage.RUN, reason, retry, status=JobStatus.PENDING_RUN):
                reaped.append(job_id)
    return reaped


#: how much later than a job's entry into pending_<stage> its message may still have been sent:
#: ``enqueue``'s publish retries (about 30 s, ``celery_app.PUBLISH_RETRY``) and the skew between
#: the publisher's clock (a message's ``SENT_HEADER``) and Redis's (the entry's score)
REPUBLISH_MARGIN_S = 60.0


def oldest_sent(broker: redis.Redis, queue: str) -> float | None:
    """When the oldest message still in ``queue`` was sent (its publisher's clock): None when the
    queue is empty, -inf when a message does not say (an older version's: it may be as old as any
    job). kombu LPUSHes and BRPOPs from the right end, so each list's oldest is its last."""
    pipe = broker.pipeline(transaction=False)
    for name in keys.broker_queue_lists(keys.broker_queue(queue)):
        pipe.lindex(name, -1)
    sent = []
    for raw in pipe.execute():
        if raw is None:
            continue
        try:
            sent.append(float(json.loads(raw)["headers"][SENT_HEADER]))
        except (ValueError, KeyError, TypeError):
            return float("-inf")
    return min(sent) if sent else None


def lost_messages(store: JobStore, broker: redis.Redis, stage: Stage, after_s: float,
                  margin_s: float = REPUBLISH_MARGIN_S, limit: int = REAP_BATCH,
                  only: set[str] | None = None) -> list[str]:
    """Jobs in ``stage``'s pending status whose message is in nobody's hands: in it for longer
    than ``after_s``, and entered more than ``margin_s`` before the oldest message still in the
    stage's queue was sent (or the queue is empty). At most ``limit``. Each is taken as if it had
    entered the status now (its entry re-scored), so it is not found again before ``after_s``.

    Why no job that waits behind a backlog is taken: a job's message is pushed after the job
    entered the status (the transition comes first) and at most ``margin_s`` later by the
    publisher's clock (publish retries, clock skew); the queue is pushed to at one end and popped
    at the other, so while the job's message is in it, its oldest was pushed no later than that
    message, and sent no later than entry + ``margin_s``.

    ``only``: take none but these (the jobs found so at the reaper's previous round: see
    ``republish_lost``); the others found are returned untaken, re-scored neither."""
    status = stage.pending.value
    index = keys.unclaimed(status)
    now = store.server_time()
    bound = now - after_s
    oldest = oldest_sent(broker, stage.value)
    if oldest is not None:
        bound = min(bound, oldest - margin_s)
    if bound == float("-inf"):
        return []
    job_ids = cast(list[str], store.redis.zrangebyscore(index, "-inf", f"({bound:.6f}", start=0, num=limit))
    if not job_ids:
        return []
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "status")
    candidates: list[str] = []
    stale: list[str] = []
    for job_id, current in zip(job_ids, pipe.execute()):
        (candidates if current == status else stale).append(job_id)
    if stale:
        reindex(store, stale, store.lease_s)
    if only is not None:
        suspected = [job_id for job_id in candidates if job_id not in only]
        candidates = [job_id for job_id in candidates if job_id in only]
        if not candidates:
            return suspected
    else:
        suspected = []
    # XX: a job claimed meanwhile (its entry dropped) is not re-added, and not published again
    for job_id in candidates:
        pipe.zadd(index, {job_id: now}, xx=True, ch=True)
    taken = [job_id for job_id, moved in zip(candidates, pipe.execute()) if moved]
    return taken if only is None else [*taken, *suspected]


def republish_lost(store: JobStore, broker: redis.Redis, republish: Callable[[Stage, list[str]], None],
                   after_s: float, margin_s: float = REPUBLISH_MARGIN_S,
                   suspects: dict[Stage, set[str]] | None = None) -> list[str]:
    """Publish again (``republish(stage, job_ids)``) the INIT and EVAL messages found lost
    (``lost_messages``); returns the jobs'. A copy of a message that was not lost after all is
    a no-op through the stage claim.

    ``suspects`` (the reaper's, kept between its rounds): a job is published again only when
    found lost at two rounds in a row. A message a worker has just fetched and not yet claimed
    (between BRPOP and the claim, longer on a loaded machine) looks lost for that moment, when
    its queue has just emptied; a round later it has been claimed."""
    republished = []
    for stage in UNCLAIMED_STAGES:
        if suspects is None:
            job_ids = lost_messages(store, broker, stage, after_s, margin_s)
        else:
            before = suspects.get(stage, set())
            found = lost_messages(store, broker, stage, after_s, margin_s, only=before)
            job_ids = [job_id for job_id in found if job_id in before]
            suspects[stage] = set(found) - before
        if job_ids:
            republish(stage, job_ids)
            for job_id in job_ids:
                log.warning("job %s: in %s for over %.0f s with no %s message queued for it; published again",
                            job_id, stage.pending.value, after_s, stage.value)
            republished += job_ids
    return republished


class Reaper:
    """Runs ``reap_expired`` every ``interval_s`` in one process of the cluster at a time, and
    ``every_tick`` (node-local duties) in every process.

    On taking the lock, and when the indexes drift from the status counters, it runs
    ``backfill`` first (rate-limited, and not again for a drift a backfill could not mend: the
    counters' own error, say a record deleted by hand)."""

    def __init__(self, store: JobStore, owner: str, *, lease_s: float, interval_s: float,
                 retry: Callable[[str], None] | None = None,
                 on_reaped: Callable[[list[str]], None] = lambda job_ids: None,
                 every_tick: Callable[[], object] = lambda: None, heartbeat_s: float | None = None,
                 broker: redis.Redis | None = None, republish: Callable[[Stage, list[str]], None] | None = None,
                 republish_after_s: float = 90.0, republish_margin_s: float = REPUBLISH_MARGIN_S,
                 on_republished: Callable[[list[str]], None] = lambda job_ids: None) -> None:
        self.store, self.owner, self.retry, self.heartbeat_s = store, owner, retry, heartbeat_s
        self.on_reaped, self.every_tick = on_reaped, every_tick
        self.lease_s, self.interval_s = lease_s, interval_s
        self.broker, self.republish, self.on_republished = broker, republish, on_republished
        self.republish_after_s, self.republish_margin_s = republish_after_s, republish_margin_s
        self._stop = threading.Event()
        self._backfilled_at: float | None = None  # monotonic; None: not since taking the lock
        #: jobs found with their INIT/EVAL message lost at the last round (republish_lost)
        self._suspects: dict[Stage, set[str]] = {}
        self._accepted_drift = (0, 0, 0)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="prorl-reaper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> list[str]:
        """One round: the node-local duties, then (holding the lock) the reaping; returns the
        ids reaped."""
        self.every_tick()  # node-local duties of every worker (sandboxes of dead owners)
        lock_s = max(1, int(self.interval_s * 2))
        redis_ = self.store.redis
        if redis_.set(keys.REAPER_LOCK, self.owner, nx=True, ex=lock_s):
            self._backfilled_at = None  # the lock changed hands: its last holder may be older code
        elif redis_.get(keys.REAPER_LOCK) == self.owner:
            redis_.expire(keys.REAPER_LOCK, lock_s)
        else:
            return []
        self._mend_indexes()
        reaped = reap_expired(self.store, self.lease_s, self.retry, self.heartbeat_s)
        if reaped:
            self.on_reaped(reaped)
        if self.broker is not None and self.republish is not None:
            republished = republish_lost(self.store, self.broker, self.republish, self.republish_after_s,
                                         self.republish_margin_s, self._suspects)
            if republished:
                self.on_republished(republished)
        return reaped

    def _mend_indexes(self) -> None:
        if self._backfilled_at is not None:
            drift = index_drifts(self.store)
            if drift in {(0, 0, 0), self._accepted_drift} or \
                    time.monotonic() - self._backfilled_at < BACKFILL_MIN_INTERVAL_S:
                return
            log.warning("reaper: indexes off the status counters by %s (executing, pending_run, "
                        "pending_init + pending_eval); backfilling", drift)
        started = time.monotonic()
        changed = backfill(self.store, self.lease_s)
        self._backfilled_at = time.monotonic()
        self._accepted_drift = index_drifts(self.store)
        if changed:
            log.warning("reaper: backfill indexed or dropped %d entries in %.2f s", changed,
                        self._backfilled_at - started)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as error:  # noqa: BLE001 - the reaper must keep running
                log.warning("reaper: %s", error)
