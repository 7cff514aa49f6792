"""Group commit of concurrent submits (and record reads) in one gateway process.

A burst of blocking ``/process`` requests would each run its own ``job_intake.submit``: one
create round trip and one INIT publish per job, 60 % of the gateway's CPU per request in a
py-spy profile of a 1,000-request burst. ``GroupCommit.submit`` instead queues a request's
prepared jobs and blocks until they are submitted; whoever finds no submit in flight leads: it
takes everything queued (its own jobs first) and submits it in one ``submit(specs)`` call (one
create pipeline, one publish pipeline). Requests that arrive meanwhile queue up behind it, and
when it is done it hands the lead to the first of them, which submits that whole queue at once.

So a quiet gateway submits each request at once, as before (no timer, no added latency), and a
busy one batches as many requests as arrived during one submit's round trips. No thread of its
own: the leader is a request's own thread, or greenlet under gunicorn's gevent worker (where
``threading`` is monkey-patched, so the lock and events below are cooperative).

A failed submit fails exactly the requests of its batch, each with the error itself (a stopped
service: ``ServiceStopped``; an unreachable broker: ``ServiceUnavailable``; an unreachable Redis:
redis-py's ``ConnectionError``, which the gateway answers as the same 503 service_unavailable),
each request raising its own copy of it: one exception object raised in many threads or
greenlets would grow one traceback out of all of theirs. Requests are checked (``prepare``)
before they are queued, so one request's bad input never reaches a batch.

The same grouping serves the gateway's own reads of job records (``Services.records``: a
``GET /jobs/<id>``, the first read of a wait, a woken request whose record the completion
listener could not read for it), concurrent ones in one pipeline.
"""
from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Spec = TypeVar("Spec")
Result = TypeVar("Result")

#: most jobs one batch submits; a request's own jobs are never split across batches
MAX_BATCH_JOBS = 2000


class _Ticket(Generic[Spec, Result]):
    """One caller's jobs on their way: woken when submitted, failed, or given the lead."""

    __slots__ = ("specs", "done", "results", "error", "lead")

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.specs = specs
        self.done = threading.Event()
        self.results: list[Result] | None = None
        self.error: BaseException | None = None
        self.lead = False  # woken to submit the queue, not with an outcome


class GroupCommit(Generic[Spec, Result]):
    """Submits the jobs of concurrent callers together through ``submit`` (one call per batch).

    ``submit(specs)`` must return one result per spec, in order; what it raises fails every
    caller of that batch."""

    def __init__(self, submit: Callable[[list[Spec]], list[Result]], *, max_batch: int = MAX_BATCH_JOBS) -> None:
        self._submit = submit
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: deque[_Ticket[Spec, Result]] = deque()
        self._leading = False  # a batch is being submitted (its leader hands over when done)
        #: calls of ``submit`` so far, and the jobs they carried (tests, metrics)
        self.batches = 0
        self.jobs = 0

    def submit(self, specs: Sequence[Spec]) -> list[Result]:
        """Submit ``specs`` (with whatever else is queued) and return their results; raises what
        the batch's submit raised."""
        ticket: _Ticket[Spec, Result] = _Ticket(specs)
        with self._lock:
            self._queue.append(ticket)
            lead = not self._leading
            self._leading = True
        if not lead:
            try:
                ticket.done.wait()
            except BaseException:  # the caller was interrupted (a gevent timeout or kill)
                self._abandon(ticket)
                raise
        if ticket.lead or lead:  # at the head of the queue: this call submits the next batch
            self._lead()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.results is not None
        return ticket.results

    def _lead(self) -> None:
        with self._lock:
            batch: list[_Ticket[Spec, Result]] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0].specs) <= self.max_batch):
                size += len(self._queue[0].specs)
                batch.append(self._queue.popleft())
        specs = [spec for ticket in batch for spec in ticket.specs]
        try:
            results = self._submit(specs)
            if len(results) != len(specs):
                raise RuntimeError(f"submit returned {len(results)} results for {len(specs)} jobs")
        except BaseException as error:  # every caller of the batch raises it (its own copy)
            for index, ticket in enumerate(batch):
                ticket.error = error if index == 0 else _copy_of(error)
        else:
            start = 0
            for ticket in batch:
                ticket.results = results[start:start + len(ticket.specs)]
                start += len(ticket.specs)
        finally:
            with self._lock:
                self.batches += 1
                self.jobs += len(specs)
                successor = self._hand_over()
            for ticket in batch:
                ticket.done.set()
            if successor is not None:
                successor.done.set()

    def _hand_over(self) -> _Ticket[Spec, Result] | None:
        """The lead passes to the head of the queue, or lapses (under the lock)."""
        if not self._queue:
            self._leading = False
            return None
        successor = self._queue[0]
        successor.lead = True
        return successor

    def _abandon(self, ticket: _Ticket[Spec, Result]) -> None:
        """Drop an interrupted caller's queued jobs; a lead it was given passes on. Jobs already
        in a batch are submitted all the same (as a request cut off after its create is)."""
        with self._lock:
            if ticket not in self._queue:
                return
            self._queue.remove(ticket)
            successor = self._hand_over() if ticket.lead else None
        if successor is not None:
            successor.done.set()


def _copy_of(error: BaseException) -> BaseException:
    """A copy of ``error`` for another caller to raise (its class, message and cause), or
    ``error`` itself when it cannot be copied."""
    try:
        twin = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception class that cannot be rebuilt from its args
        return error
    if type(twin) is not type(error):
        return error
    twin.__cause__, twin.__context__ = error.__cause__, error.__context__
    twin.__suppress_context__ = error.__suppress_context__
    return twin
