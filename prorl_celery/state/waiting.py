"""Waiting for jobs to end: one Redis connection per process, however many waiters.

Every transition to a terminal status appends ``{job, status}`` to one stream
(``keys.JOBS_ENDED``, capped). One listener per process tails it with ``XREAD BLOCK`` and wakes
the local waiters of each job named there; a waiter holds only an event, never a Redis
connection (and, under the gateway's gevent worker, never an OS thread either: the event and
the socket are cooperative). 2,000 clients blocked in ``/process`` cost one connection and one
``XREAD`` per batch of jobs that end, not 2,000 blocking reads.

No ending can be missed: a waiter registers before it reads the job's status, and the
listener's cursor is taken before the first registration, so an ending either precedes the
status read (seen there) or follows the cursor (seen by the listener). The stream is capped and
Redis can restart, so the listener also re-reads the status of every waited-on job every
``sweep_s`` (one pipelined round trip) and wakes those that ended.

One request may wait for many jobs (``POST /jobs/wait``): ``register_many`` registers them all
at once, before their statuses are read (one pipelined round trip, ``read_statuses``), and
returns a :class:`ManyWait` whose one event the listener sets for any of them, with the ids that
ended queued behind it; the argument above holds per id. Each id costs a small registration
object, not an event to park on, a thread or a connection.

A wait that will answer with the job's record (the gateway's ``/process`` and
``GET /jobs/<id>?wait=``) registers a :class:`RecordWait` (``register_record``) and waits with
``wait_record``: when the stream names its job, the listener reads the hashes of every such job
of that read in one round trip on its own connection before it wakes them, so a woken request
answers at once instead of going back to Redis for its record (a round trip, a hand-off and a
pass through redis-py's client per request).
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar, cast

import redis

from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys
from prorl_celery.state._redis_raw import command, commands
from prorl_celery.state.connection import BLOCK_CHUNK_S, StreamEntry

log = logging.getLogger(__name__)
TERMINAL = frozenset(s.value for s in JobStatus if s.terminal)
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0  # listener's reconnect backoff while Redis is away
#: most records the listener reads in one round trip for the waits it wakes
RECORD_SLICE = 500


class _Wakeable(Protocol):
    def set(self) -> None: ...


class ManyWait:
    """The ids of many waited-on jobs that the listener saw end, in the order it saw them.

    ``take`` blocks (cooperatively under gevent: the event and lock are patched) until at least
    one id is queued or the timeout passes. An id may be queued more than once (the stream and
    the sweep both saw it): the caller keeps its own set of ids still to report."""

    def __init__(self, waiter: CompletionWaiter, job_ids: list[str]) -> None:
        self.waiter = waiter
        self.job_ids = job_ids
        self._members = {job_id: _Member(self, job_id) for job_id in job_ids}
        self._ended: list[str] = []
        self._lock = threading.Lock()
        self._event = threading.Event()

    def _add(self, job_id: str) -> None:
        with self._lock:
            self._ended.append(job_id)
        self._event.set()

    def take(self, timeout_s: float) -> list[str]:
        """The ids queued since the last call (waiting up to ``timeout_s`` for one)."""
        self._event.wait(max(0.0, timeout_s))
        with self._lock:
            self._event.clear()  # under the lock: an id added after the swap sets it again
            ended, self._ended = self._ended, []
        return ended

    def drop(self, job_ids: Iterable[str]) -> None:
        """Stop waiting for these ids (reported already)."""
        self.waiter._unregister_members([(j, m) for j in job_ids if (m := self._members.pop(j, None)) is not None])

    def close(self) -> None:
        """Stop waiting for every id left (the stream ended, or its client went away)."""
        members, self._members = self._members, {}
        self.waiter._unregister_members(list(members.items()))


class _Member:
    """One id's registration of a ManyWait: set() queues the id there."""

    __slots__ = ("job_id", "wait")

    def __init__(self, wait: ManyWait, job_id: str) -> None:
        self.wait, self.job_id = wait, job_id

    def set(self) -> None:
        self.wait._add(self.job_id)


Record = TypeVar("Record", bound="_HasStatus")


class _HasStatus(Protocol):
    @property
    def status(self) -> JobStatus: ...


class RecordWait(Generic[Record]):
    """One request's wait for one job, answered with the job's record: when the stream names the
    job, the listener reads its hash (with the others of that read, on its own connection) and
    ``decode``s it before waking the wait."""

    __slots__ = ("job_id", "decode", "event", "record", "fetched")

    def __init__(self, job_id: str, decode: Callable[[dict[str, str]], Record]) -> None:
        self.job_id = job_id
        self.decode = decode
        self.event = threading.Event()
        self.record: Record | None = None
        self.fetched = False  # ``record`` was read after the last wake-up (None: no such job)

    def set(self) -> None:
        self.event.set()


class CompletionWaiter:
    def __init__(self, client: redis.Redis, sweep_s: float = 5.0) -> None:
        self.redis = client
        self.sweep_s = sweep_s
        self._events: dict[str, list[_Wakeable]] = {}
        #: status named by the stream for a job being waited on (spares the waiter a re-read)
        self._ended: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._cursor: str | None = None
        self._stop = threading.Event()

    def register(self, job_id: str) -> threading.Event:
        """Start waiting for ``job_id`` before it can end (before it is created): the ending is
        then seen by the listener, so ``wait(..., registered=...)`` needs no first status read.
        Pass the event to ``wait`` (which drops it), or to ``unregister`` if never waited on."""
        event = threading.Event()
        self._ensure_started()  # the cursor precedes the registration (module doc)
        with self._lock:
            self._events.setdefault(job_id, []).append(event)
        return event

    def unregister(self, job_id: str, event: threading.Event | RecordWait[Any]) -> None:
        self._unregister_members([(job_id, event)])

    def register_record(self, job_id: str, decode: Callable[[dict[str, str]], Record]) -> RecordWait[Record]:
        """``register`` for a wait that answers with the job's record (``wait_record``): when the
        stream names the job, the listener reads its hash (``keys.job``) with every other such
        job of that read and ``decode``s it before waking the wait."""
        wait: RecordWait[Record] = RecordWait(job_id, decode)
        self._ensure_started()  # the cursor precedes the registration (module doc)
        with self._lock:
            self._events.setdefault(job_id, []).append(wait)
        return wait

    def wait_record(self, job_id: str, timeout_s: float, read: Callable[[list[str]], list[Record | None]],
                    decode: Callable[[dict[str, str]], Record], *,
                    registered: RecordWait[Record] | None = None) -> Record | None:
        """The job's record once it has ended, or when ``timeout_s`` passes (then as it is); None:
        no such job. ``read`` is this request's own read of records (many ids at once);
        ``decode`` turns a job's hash into its record (the listener's reads).

        ``registered``: ``register_record``'s wait, taken before the job was created: no read at
        all until it ends (the listener's read answers). Otherwise the record is read once after
        registering, so a job that ended before the call is answered from that read."""
        if registered is None and timeout_s <= 0:
            (record,) = read([job_id])  # nothing to wait for: one read, no registration
            return record
        wait = registered or self.register_record(job_id, decode)

        def read_status() -> JobStatus | None:
            (record,) = read([job_id])
            wait.record, wait.fetched = record, True
            return record.status if record is not None else None
        if registered is None:
            status = read_status()
            if status is None or status.terminal:
                self.unregister(job_id, wait)
                return wait.record
        status = self.wait(job_id, timeout_s, read_status, registered=wait)
        if status is None:
            return None
        record = wait.record if wait.fetched else None
        if record is None or record.status.terminal != status.terminal:  # not read since the wake-up
            (record,) = read([job_id])
        return record

    def register_many(self, job_ids: Iterable[str]) -> ManyWait:
        """Start waiting for every one of ``job_ids`` (duplicates once) under one lock; read
        their statuses only after this (``read_statuses``), as ``wait`` does for one. Close the
        returned :class:`ManyWait` when done (it unregisters whatever is left)."""
        many = ManyWait(self, list(dict.fromkeys(job_ids)))
        self._ensure_started()  # the cursor precedes the registrations (module doc)
        with self._lock:
            for job_id, member in many._members.items():
                self._events.setdefault(job_id, []).append(member)
        return many

    def read_statuses(self, job_ids: list[str]) -> list[str | None]:
        """Every job's status in one pipelined round trip (None: no such job)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        return cast(list[str | None], pipe.execute())

    def _unregister_members(self, members: list[tuple[str, _Wakeable]]) -> None:
        with self._lock:
            for job_id, member in members:
                waiting = self._events.get(job_id, [])
                if member in waiting:
                    waiting.remove(member)
                if not waiting:
                    self._events.pop(job_id, None)
                    self._ended.pop(job_id, None)

    def wait(self, job_id: str, timeout_s: float, read_status: Callable[[], JobStatus | None], *,
             skip_first_read: bool = False,
             registered: threading.Event | RecordWait[Any] | None = None) -> JobStatus | None:
        """Block until ``read_status()`` is terminal or ``timeout_s`` passes; returns the last
        status read (None: the job does not exist).

        ``registered``: the event ``register`` gave before the job was created; the first read
        is skipped then (an ending can only come after the registration)."""
        deadline = time.monotonic() + timeout_s
        registration: threading.Event | RecordWait[Any]
        if registered is None:
            registration = event = self.register(job_id)
        else:
            registration, skip_first_read = registered, True
            event = registered.event if isinstance(registered, RecordWait) else registered
        try:
            status: JobStatus | None = None
            first = True
            while True:
                if not (first and skip_first_read):
                    event.clear()  # before the read: a wake-up after it is kept
                    status = read_status()
                    if status is None or status.terminal or time.monotonic() >= deadline:
                        return status
                first = False
                event.wait(max(0.0, deadline - time.monotonic()))
                with self._lock:
                    ended = self._ended.get(job_id)
                if ended is not None:
                    return JobStatus(ended)
                if time.monotonic() >= deadline and not event.is_set():
                    return read_status()
        finally:
            self.unregister(job_id, registration)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._events.values())

    def close(self) -> None:
        """Stop the listener: at once when it is between reads, else when its read returns
        (within ``BLOCK_CHUNK_S``), silently even if Redis has gone meanwhile."""
        self._stop.set()

    # -- the listener ------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._cursor is None:  # before any waiter reads a status: see the module doc
                self._cursor = self._last_id()
            # the thread holds the waiter weakly between reads: a waiter nobody closed (a test's
            # store) stops its listener once it is collected, instead of outliving its Redis
            state = _Listening(self.sweep_s, self.redis.connection_pool)
            self._thread = threading.Thread(target=_listen, args=(weakref.ref(self), self._stop, state),
                                            name="prorl-waiter", daemon=True)
            self._thread.start()

    def _last_id(self) -> str:
        newest = cast(list[StreamEntry], self.redis.xrevrange(keys.JOBS_ENDED, count=1))
        return newest[0][0] if newest else "0-0"

    def _wake(self, job_ids: list[str]) -> None:
        """Wake the waiters of ``job_ids`` (the sweep's: they re-read the status)."""
        events: list[_Wakeable] = []
        with self._lock:
            for job_id in job_ids:
                events += self._events.get(job_id, ())
        for event in events:
            event.set()

    def _listen_once(self, state: _Listening) -> None:
        """One read of the stream (and the sweep when due); a lost Redis backs off."""
        try:
            block_ms = int(max(0.05, min(BLOCK_CHUNK_S, state.next_sweep - time.monotonic())) * 1000)
            self._read_ended(state, block_ms)
            if time.monotonic() >= state.next_sweep:
                self._sweep()
                state.next_sweep = time.monotonic() + self.sweep_s
            if state.outage:
                log.info("completion listener reached Redis again after %d failed reads", state.outage)
                state.outage = 0
        except redis.RedisError as error:
            if self._stop.is_set():
                return
            if not state.outage:  # the text only: a kept record must not keep this waiter alive
                log.warning("completion listener lost Redis (%s); retrying with backoff", str(error))
            state.outage += 1
            self._stop.wait(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (state.outage - 1)))
            state.next_sweep = time.monotonic()  # whatever ended meanwhile: found by the sweep

    def _read_ended(self, state: _Listening, block_ms: int) -> None:
        """One XREAD of the stream; wakes the waiters of the jobs it names.

        Every gateway process reads every ending, though it waits on only its own share of them
        (a 1,000-job burst over 2 workers: 1,000 entries read by each, 500 of them someone
        else's). So the reply is taken as Redis sends it (``_Listening.xread``: no redis-py
        callback turning each entry into a tuple and a dict) and an entry costs one dict look-up
        unless this process waits on its job."""
        reply: Any = state.xread(self._cursor or "0-0", block_ms)
        if not reply:
            return
        # RESP3 answers a map {stream: entries}, RESP2 a list of [stream, entries]
        entries: list[Any] = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        self._cursor = entries[-1][0]
        events: list[_Wakeable] = []
        with self._lock:
            waited = self._events
            for _, fields in entries:  # fields: [name, value, ...], as transition.lua XADDs them
                if not fields:
                    continue
                job_id = fields[1] if fields[0] == "job" else _field(fields, "job")
                waiting = waited.get(job_id)
                if waiting:
                    events += waiting
                    self._ended[job_id] = fields[3] if len(fields) > 3 and fields[2] == "status" \
                        else _field(fields, "status")
        for event in events:  # those that read for themselves first: they need nothing more
            if not isinstance(event, RecordWait):
                event.set()
        _read_records_and_wake(state, [event for event in events if isinstance(event, RecordWait)])

    def _sweep(self) -> None:
        with self._lock:
            job_ids = list(self._events)
        if not job_ids:
            return
        statuses = self.read_statuses(job_ids)
        self._wake([j for j, status in zip(job_ids, statuses) if status is None or status in TERMINAL])


def _read_records_and_wake(state: _Listening, waits: list[RecordWait[Any]]) -> None:
    """Read the records of ``waits``, then wake them: the hashes of ``RECORD_SLICE`` jobs per
    round trip on the listener's connection (results can be large, and the first requests answer
    while the next slice is read). A failed read leaves its waits unread: each woken request
    then reads its own."""
    for wait in waits:
        wait.fetched = False
    for start in range(0, len(waits), RECORD_SLICE):
        chunk = waits[start:start + RECORD_SLICE]
        job_ids = list(dict.fromkeys(wait.job_id for wait in chunk))
        try:
            hashes = dict(zip(job_ids, state.read_hashes([keys.job(job_id) for job_id in job_ids])))
        except Exception as error:  # noqa: BLE001 - the requests read for themselves
            log.debug("completion listener could not read %d records: %s", len(job_ids), error)
            hashes = None
        for wait in chunk:
            if hashes is not None:
                found = hashes[wait.job_id]
                try:
                    wait.record, wait.fetched = (wait.decode(found) if found else None), True
                except Exception:  # noqa: BLE001 - a record it cannot decode: the request reads it (and says why)
                    log.exception("completion listener could not decode the record of %s", wait.job_id)
            wait.set()


def _field(fields: list[str], name: str) -> str:
    """``name``'s value in a flat [name, value, ...] list ("" when absent)."""
    pairs = dict(zip(fields[::2], fields[1::2]))
    return pairs.get(name, "")


class _Listening:
    """The listener's own state between reads, its connection included."""

    def __init__(self, sweep_s: float, pool: redis.ConnectionPool) -> None:
        self.next_sweep = time.monotonic() + sweep_s
        self.outage = 0  # consecutive failed reads: the retry backs off, and one outage logs once
        self.pool = pool
        self.connection: Any = None

    def xread(self, cursor: str, block_ms: int) -> Any:
        """XREAD of the stream after ``cursor``, its reply as Redis sends it, on the listener's
        own connection of the pool, held from one read to the next: a read through the client
        (pool checkout and release, retries, redis-py's metrics hooks) ran about 150 Python calls
        per read, once per wake-up in every gateway process. A failed read drops the connection
        (the next read takes a new one) and raises redis-py's error."""
        connection = self.connection
        if connection is None:
            connection = self.connection = self.pool.get_connection()
        try:
            return command(connection, "XREAD", "COUNT", 5000, "BLOCK", block_ms, "STREAMS", keys.JOBS_ENDED, cursor)
        except BaseException:
            self.close()
            raise

    def read_hashes(self, keys_: list[str]) -> list[dict[str, str]]:
        """HGETALL of every key, sent at once on the listener's connection (RESP2's flat lists
        as dicts, as the client's callback makes them)."""
        connection = self.connection
        if connection is None:
            connection = self.connection = self.pool.get_connection()
        try:
            replies = commands(connection, [("HGETALL", key) for key in keys_])
        except BaseException:
            self.close()
            raise
        return [reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2])) for reply in replies]

    def close(self) -> None:
        """Give the connection back to the pool, closed (a read may have been cut mid-reply)."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.disconnect()
            self.pool.release(connection)


def _listen(ref: weakref.ReferenceType[CompletionWaiter], stop: threading.Event, state: _Listening) -> None:
    try:
        while not stop.is_set():
            waiter = ref()
            if waiter is None:
                return
            waiter._listen_once(state)
            del waiter  # held only during a read
    finally:
        state.close()
