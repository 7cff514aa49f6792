"""Trainer-side clients of the rollout gateway: :class:`AsyncRolloutClient` and :class:`RolloutClient`.

Submit jobs (``POST /jobs``), wait for one (``GET /jobs/<id>?wait=``) or many (``POST /jobs/wait``:
one NDJSON stream of results as they end, per ``WAIT_MANY_MAX`` ids), iterate results as they
complete, cancel, register LLM servers, read the status. Every job id is made here before the
first attempt, so a submit retried after a lost reply finds the job already created and never
runs it twice. Requests that fail to connect, or get 502/503/504, are retried with exponential
backoff (bounded by :class:`RetryPolicy`), moving on to the next gateway URL each time: several
URLs of one deployment serve every job alike, since all state is in Redis.

Errors::

    ProrlError                                    (prorl_celery.core.errors; .code, .message)
    ├── HTTPError: raised as the class the gateway's "code" names, with .status_code set:
    │   BadRequest 400, UnknownTask 400, JobNotFound(KeyError) 404, Conflict 409, PayloadTooLarge 413,
    │   ServiceStopped 503 (once the retries are spent)
    └── ClientError                               raised by this module only
        ├── RequestRejected                       any other 4xx
        ├── GatewayError                          any other 5xx, or a reply that is not JSON
        ├── GatewayUnavailable(ConnectionError)   no URL answered within the retry budget
        ├── WaitTimeout(TimeoutError)             wait() gave up; the job itself goes on
        └── RewardInvalid                         a rollout's reward stayed invalid after every
                                                  resubmission (raised by trainer integrations
                                                  that cannot drop a sample)

Results: every ended job says how it ended (DESIGN decision 16, :mod:`prorl_celery.core.outcomes`):
``outcome``, ``reward_valid``, ``retryable``, ``outcome_stage``, ``detail``, ``attempts``, and a
``reward`` that is a number only when it is valid. Read them through :class:`RolloutOutcome`
(``RolloutOutcome.of(result)``) and :func:`reward_of`, the one rule every trainer-side path uses
(it also reads results of a server from before outcomes, whose reward is valid only when the job
completed), never through the dict keys. :meth:`AsyncRolloutClient.run_until_valid` resubmits
rollouts whose reward is not valid, up to a bound.

:class:`RolloutClient` is the blocking facade: it runs one :class:`AsyncRolloutClient` on a
private event-loop thread, so retries, fail-over and ``as_completed`` exist once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote

import httpx

from prorl_celery.core.errors import (
    BadRequest,
    Conflict,
    HTTPError,
    JobNotFound,
    PayloadTooLarge,
    ProrlError,
    ServiceStopped,
    ServiceUnavailable,
    UnknownTask,
)
from prorl_celery.core.forks import new_group_id
from prorl_celery.core.outcomes import Outcome, of_status
from prorl_celery.core.status import TERMINAL, JobStatus

T = TypeVar("T")
log = logging.getLogger(__name__)
#: most ids one ``POST /jobs/wait`` takes (the gateway's ``api.schemas.MAX_WAIT_IDS``)
WAIT_MANY_MAX = 10_000
#: longest single ``POST /jobs/wait``; a wait without a limit reconnects after it with the ids left
WAIT_WINDOW_S = 600.0
#: the gateway's keep-alive newline on a quiet stream, this often (a read timeout well above it)
WAIT_HEARTBEAT_S = 5.0
TERMINAL_STATUSES = frozenset(s.value for s in TERMINAL)
RETRY_STATUSES = frozenset({502, 503, 504})
#: gateway error codes raised as the project's own classes
SERVER_ERRORS: dict[str, type[HTTPError]] = {
    cls.code: cls for cls in (BadRequest, UnknownTask, JobNotFound, Conflict, PayloadTooLarge, ServiceStopped,
                              ServiceUnavailable)}


class ClientError(ProrlError):
    """An error seen by the client that the gateway's error tree does not name."""

    code = "client_error"

    def __init__(self, message: str, *, status_code: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        if code:
            self.code = code


class RequestRejected(ClientError):
    """A 4xx whose code this client does not know; ``code`` and ``message`` are the gateway's."""


class GatewayError(ClientError):
    """A 5xx that is not retried, or a reply that is not the gateway's JSON."""


class GatewayUnavailable(ClientError, ConnectionError):
    """No gateway URL could be reached within the retry budget."""

    code = "gateway_unavailable"


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` ran out of time; the job still runs (wait again, or cancel it)."""

    code = "wait_timeout"

    def __init__(self, job_id: str, status: str | None) -> None:
        super().__init__(f"job {job_id} has not ended (status {status})")
        self.job_id, self.status = job_id, status


class RewardInvalid(ClientError):
    """A rollout's reward is still not valid after its resubmissions; ``outcome`` and ``detail``
    are the last attempt's (:class:`RolloutOutcome`)."""

    code = "reward_invalid"

    def __init__(self, message: str, outcome: RolloutOutcome | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


# -- how a job ended ---------------------------------------------------------------------------

def reward_of(result: Mapping[str, Any]) -> float | None:
    """The reward of an ended job's ``result`` when it measures the policy, else None.

    The one rule of the trainer side: a result that carries ``reward_valid`` says so itself; a
    result from a server older than outcomes has none, and its reward is valid only when its
    ``status`` is ``completed``. A valid result without a number is no reward either.
    """
    valid = result.get("reward_valid")
    if valid is None:
        valid = result.get("status") == "completed"
    reward = result.get("reward")
    if not valid or isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


def is_trainable(result: Mapping[str, Any]) -> bool:
    """May a trainer learn from this result's reward (:func:`reward_of` is not None)?"""
    return reward_of(result) is not None


@dataclass(frozen=True)
class RolloutOutcome:
    """How one job ended, as a trainer reads it: ``RolloutOutcome.of(result)``.

    ``outcome`` is one of :class:`prorl_celery.core.outcomes.Outcome`'s values (``ok``,
    ``agent_error``, ``env_error``, ``backend_error``, ``eval_error``, ``timeout``,
    ``cancelled``), or None while the job has not ended. For a result from a server older than
    outcomes it is derived from the status (``failed`` is ``env_error``, or ``eval_error`` when
    EVAL failed) and ``detail`` is its ``error``.
    """

    job_id: str | None
    status: str | None
    outcome: str | None
    #: the reward measures the policy (``reward`` is its number)
    reward_valid: bool
    #: another attempt may end differently (the failure was outside the policy)
    retryable: bool
    reward: float | None = None
    #: the stage the outcome came from (init, run, eval), when one did
    stage: str | None = None
    #: what caused it: the missing module, the backend's status, the signal
    detail: str | None = None
    #: the attempts before the last, each ``{attempt, outcome, stage, detail, node}``
    attempts: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> RolloutOutcome:
        reward = reward_of(result)
        status = result.get("status")
        outcome = result.get("outcome") or _legacy_outcome(result)
        retryable = result.get("retryable")
        if retryable is None:
            retryable = outcome in {o.value for o in Outcome if o.retryable}
        return cls(job_id=result.get("job_id"), status=status, outcome=outcome, reward_valid=reward is not None,
                   retryable=bool(retryable), reward=reward,
                   stage=result.get("outcome_stage", result.get("critical_error")),
                   detail=result.get("detail") or result.get("error"),
                   attempts=tuple(result.get("attempts") or ()))

    def describe(self) -> str:
        """``job <id> ended <outcome> (<stage>): <detail>``, for logs and errors."""
        where = f" in {self.stage}" if self.stage else ""
        return f"job {self.job_id} ended {self.outcome}{where}: {self.detail or self.status}"


def _legacy_outcome(result: Mapping[str, Any]) -> str | None:
    """The outcome of a result without one (a server from before outcomes), from its status."""
    try:
        status = JobStatus(result.get("status"))
    except ValueError:
        return None
    if not status.terminal:
        return None
    return of_status(status, critical=result.get("critical_error")).value


def new_job_id(prefix: str = "") -> str:
    """A fresh id matching the gateway's ``[A-Za-z0-9_.:-]{1,128}``."""
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts ``attempts`` times at most, sleeping ``backoff_s * 2**k`` (capped, jittered)
    between attempts, and gives up once ``deadline_s`` would be exceeded."""

    attempts: int = 12
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    deadline_s: float = 60.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


@dataclass
class JobRequest:
    """One ``POST /jobs`` body; ``job_id`` is fixed at construction so retries reuse it."""

    instance: dict[str, Any]
    sampling_params: dict[str, Any] = field(default_factory=dict)
    job_id: str = field(default_factory=new_job_id)
    task: str | None = None
    timeout_s: float | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"instance": self.instance, "sampling_params": self.sampling_params,
                                "job_id": self.job_id}
        body.update({k: v for k, v in (("task", self.task), ("timeout_s", self.timeout_s)) if v is not None})
        return body


@dataclass(frozen=True)
class CancelOutcome:
    cancelled: list[str]
    #: job id -> its status when the cancel arrived (``completed``, ..., or ``not_found``)
    not_cancelled: dict[str, str]


def raise_for_reply(response: httpx.Response) -> None:
    """Raise the error a non-2xx reply stands for (see the module docstring)."""
    if response.is_success:
        return
    try:
        body = response.json()
        code, message = str(body["code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "", response.text[:500] or response.reason_phrase
    cls = SERVER_ERRORS.get(code)
    if cls is not None and cls.http_status == response.status_code:
        error = cls(message)
        error.status_code = response.status_code  # type: ignore[attr-defined]
        raise error
    kind = RequestRejected if response.is_client_error else GatewayError
    raise kind(f"{response.request.method} {response.request.url.path}: {response.status_code} "
               f"{code or 'error'}: {message}", status_code=response.status_code, code=code or None)


class AsyncRolloutClient:
    """asyncio client of one rollout deployment (one or more gateway URLs).

    ``max_waits`` bounds concurrent long-polls (each holds a gateway thread while it waits);
    ``poll_s`` is the longest single ``?wait=``. ``transport`` replaces the network (tests).
    """

    def __init__(self, urls: str | Sequence[str], *, retry: RetryPolicy | None = None,
                 timeout_s: float = 30.0, poll_s: float = 20.0, max_waits: int = 128,
                 submit_concurrency: int = 16, transport: httpx.AsyncBaseTransport | None = None,
                 token: str | None = None) -> None:
        """``token``: the gateway's bearer token (PRORL_API_TOKEN, or the admin token)."""
        self.urls = [urls.rstrip("/")] if isinstance(urls, str) else [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("give at least one gateway URL")
        self.retry = retry or RetryPolicy()
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._current = 0
        #: attempts that failed and were retried (connection errors, 502/503/504), for monitoring
        self.retried = 0
        self._wait_slots = asyncio.Semaphore(max_waits)
        self._submit_slots = asyncio.Semaphore(submit_concurrency)
        limits = httpx.Limits(max_connections=max_waits + submit_concurrency + 8,
                              max_keepalive_connections=max_waits + submit_concurrency)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._http = httpx.AsyncClient(timeout=timeout_s, limits=limits, transport=transport, headers=headers)

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    # -- transport with retries and fail-over ------------------------------------------------

    async def request(self, method: str, path: str, *, json: Any = None, params: Mapping | None = None,
                      timeout_s: float | None = None, idempotent: bool = True) -> httpx.Response:
        """Send to the current URL; on a connection error or 502/503/504, back off and fail over.

        A non-idempotent request is retried only when it certainly never reached a gateway.
        """
        started, attempt = time.monotonic(), 0
        while True:
            url = self.urls[self._current]
            try:
                response = await self._http.request(method, url + path, json=json, params=params,
                                                    timeout=timeout_s or self.timeout_s)
            except httpx.TransportError as error:
                if not idempotent and not isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
                    raise GatewayUnavailable(f"{method} {path} on {url}: {error!r}") from error
                failure: httpx.Response | Exception = error
            else:
                if response.status_code not in RETRY_STATUSES:
                    raise_for_reply(response)
                    return response
                failure = response
            self._fail_over(url)
            self.retried += 1
            attempt += 1
            delay = self.retry.delay(attempt)
            if attempt >= self.retry.attempts or time.monotonic() - started + delay > self.retry.deadline_s:
                return self._give_up(method, path, failure, attempt)
            await asyncio.sleep(delay)

    def _fail_over(self, url: str) -> None:
        if self.urls[self._current] == url:  # another request may have moved on already
            self._current = (self._current + 1) % len(self.urls)

    def _give_up(self, method: str, path: str, failure: httpx.Response | Exception, attempts: int) -> NoReturn:
        if isinstance(failure, httpx.Response):
            raise_for_reply(failure)  # raises: only RETRY_STATUSES (errors all) are retried
            raise AssertionError(f"{failure.status_code} was retried but is a success")
        raise GatewayUnavailable(f"{method} {path}: no gateway of {self.urls} answered after {attempts} "
                                 f"attempts; last error {failure!r}") from failure

    # -- jobs ------------------------------------------------------------------------------------

    async def submit(self, instance: dict[str, Any], *, sampling_params: dict[str, Any] | None = None,
                     job_id: str | None = None, task: str | None = None, timeout_s: float | None = None) -> str:
        """Create one job; returns its id (the given one, or a fresh one)."""
        request = JobRequest(instance, sampling_params or {}, job_id or new_job_id(), task, timeout_s)
        return await self.submit_request(request)

    async def submit_request(self, request: JobRequest) -> str:
        """Create the job a :class:`JobRequest` describes; returns its id."""
        async with self._submit_slots:
            response = await self.request("POST", "/jobs", json=request.body())
        return response.json()["job_id"]

    async def submit_many(self, requests: Iterable[JobRequest], *, batch_size: int = 500) -> list[str]:
        """Create every job, ``batch_size`` per ``POST /jobs`` (one Redis round trip each, batches
        ``submit_concurrency`` at a time); ids in the order given. A rejected request rejects its
        batch (the error names its index there); ids are fixed, so a retried batch is a no-op for
        the jobs that exist already."""
        requests = list(requests)
        chunks = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
        return [job_id for ids in await asyncio.gather(*(self._submit_batch(c) for c in chunks)) for job_id in ids]

    async def _submit_batch(self, requests: list[JobRequest]) -> list[str]:
        async with self._submit_slots:
            response = await self.request("POST", "/jobs", json=[r.body() for r in requests])
        return [job["job_id"] for job in response.json()["jobs"]]

    async def submit_group(self, instance: dict[str, Any], num_samples: int, *,
                           sampling_params: dict[str, Any] | None = None, group_id: str | None = None,
                           task: str | None = None, timeout_s: float | None = None) -> list[str]:
        """``num_samples`` rollouts of one instance (a GRPO group) in one request: ids
        ``<group_id>-<i>``, each instance's ``trajectory_id`` set to ``i``."""
        body = {**JobRequest(instance, sampling_params or {}, group_id or new_job_id(), task, timeout_s).body(),
                "num_samples": num_samples}
        async with self._submit_slots:
            response = await self.request("POST", "/jobs", json=body)
        return [job["job_id"] for job in response.json()["jobs"]]

    async def poll(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The result (``status`` terminal) or the pending record, after waiting up to ``wait_s``."""
        response = await self.request("GET", f"/jobs/{quote(job_id, safe='')}", params={"wait": wait_s},
                                      timeout_s=wait_s + self.timeout_s)
        return response.json()

    async def wait(self, job_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """The job's result once it has ended; WaitTimeout after ``timeout_s`` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = self.poll_s if deadline is None else max(0.0, min(self.poll_s, deadline - time.monotonic()))
            async with self._wait_slots:
                reply = await self.poll(job_id, round(left, 3))
            if reply.get("status") in TERMINAL_STATUSES:
                return reply
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job_id, reply.get("status"))

    async def wait_all(self, job_ids: Sequence[str], timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Every result, in the order of ``job_ids`` (through :meth:`wait_stream`)."""
        ids = list(job_ids)
        results: dict[str, dict[str, Any]] = {}
        async with contextlib.aclosing(self.wait_stream(ids, timeout_s)) as outcomes:
            async for job_id, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
                results[job_id] = outcome
        return [results[j] for j in ids]

    async def as_completed(self, job_ids: Iterable[str],
                           timeout_s: float | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each job's result as it ends (each distinct id once; :meth:`wait_stream`);
        leaving the loop early stops the waiting. An unknown id raises JobNotFound, a job not
        ended within ``timeout_s`` WaitTimeout, when its turn comes."""
        async with contextlib.aclosing(self.wait_stream(job_ids, timeout_s)) as outcomes:
            async for _, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
                yield outcome

    async def wait_stream(self, job_ids: Iterable[str], timeout_s: float | None = None,
                          ) -> AsyncGenerator[tuple[str, dict[str, Any] | ProrlError], None]:
        """``(job_id, outcome)`` for each distinct job as it ends: its result, JobNotFound for an
        unknown id, or WaitTimeout once ``timeout_s`` passed (None: no limit).

        One ``POST /jobs/wait`` stream per ``WAIT_MANY_MAX`` ids, all at once. A dropped stream
        (or 502/503/504) is retried under the :class:`RetryPolicy`, failing over, with the ids
        still left; its budget starts again whenever a result arrives. Once it is spent the
        generator raises GatewayUnavailable (or the error the gateway answered with).
        Closing the generator closes the streams, which frees the gateway's waits.
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        queue: asyncio.Queue[tuple[str, dict[str, Any] | ProrlError] | BaseException] = asyncio.Queue()
        streams = [asyncio.ensure_future(self._wait_chunk(ids[i:i + WAIT_MANY_MAX], deadline, queue))
                   for i in range(0, len(ids), WAIT_MANY_MAX)]
        try:
            for _ in range(len(ids)):
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for stream in streams:
                stream.cancel()
            await asyncio.gather(*streams, return_exceptions=True)

    async def _wait_chunk(self, job_ids: list[str], deadline: float | None,
                          queue: asyncio.Queue[tuple[str, dict[str, Any] | ProrlError] | BaseException]) -> None:
        """Stream one chunk's outcomes into ``queue``, reconnecting with the ids left; its
        failure goes into the queue too (a task's exception would be seen by nobody)."""
        left = dict.fromkeys(job_ids)  # ordered: a reconnect asks in the original order
        started, attempt = time.monotonic(), 0
        timeout = httpx.Timeout(self.timeout_s, read=max(self.timeout_s, 4 * WAIT_HEARTBEAT_S))
        try:
            while left:
                now = time.monotonic()
                window = WAIT_WINDOW_S if deadline is None else max(0.0, min(WAIT_WINDOW_S, deadline - now))
                final = deadline is not None and now + window >= deadline
                url = self.urls[self._current]
                body = {"job_ids": list(left), "timeout_s": round(window, 3), "heartbeat_s": WAIT_HEARTBEAT_S}
                failure: httpx.Response | Exception
                try:
                    async with self._wait_slots, self._http.stream("POST", url + "/jobs/wait", json=body,
                                                                    timeout=timeout) as response:
                        if response.status_code not in RETRY_STATUSES:
                            if not response.is_success:
                                await response.aread()
                                raise_for_reply(response)
                            async for line in response.aiter_lines():
                                outcome = _stream_outcome(line, left, final)
                                if outcome is not None:
                                    del left[outcome[0]]
                                    queue.put_nowait(outcome)
                                    started, attempt = time.monotonic(), 0  # progress: a fresh budget
                            continue  # the window ended: the ids left (if any) once more
                        await response.aread()
                        failure = response
                except httpx.TransportError as error:  # refused, dropped mid-stream, read timeout
                    failure = error
                self._fail_over(url)
                self.retried += 1
                attempt += 1
                delay = self.retry.delay(attempt)
                if attempt >= self.retry.attempts or time.monotonic() - started + delay > self.retry.deadline_s:
                    self._give_up("POST", "/jobs/wait", failure, attempt)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - raised by wait_stream, in the caller's task
            queue.put_nowait(error)

    async def process(self, instance: dict[str, Any], *, timeout_s: float | None = None,
                      wait_timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """Submit and wait (like ``POST /process``, but resumable by job id across failures)."""
        job_id = await self.submit(instance, timeout_s=timeout_s, **fields)
        return await self.wait(job_id, wait_timeout_s)

    async def run_until_valid(self, requests: Sequence[JobRequest], *, max_resubmits: int = 0,
                              timeout_s: float | None = None) -> list[list[dict[str, Any]]]:
        """Run every request, and resubmit each whose reward is not valid (:func:`reward_of`)
        under the job id ``<job_id>-re<k>`` (the same instance and sampling), up to
        ``max_resubmits`` times. Returns, per request in order, every result it got: the last
        one is valid, or the last attempt's when the resubmissions were spent.

        Jobs are submitted with :meth:`submit_many` (ids fixed, so a retried round never runs a
        job twice); ``timeout_s`` bounds each round's wait (WaitTimeout).
        """
        if max_resubmits < 0:
            raise ValueError(f"max_resubmits must be 0 or more, not {max_resubmits}")
        history: list[list[dict[str, Any]]] = [[] for _ in requests]
        pending = list(enumerate(requests))
        for resubmit in range(1, max_resubmits + 2):
            results = await self.wait_all(await self.submit_many(r for _, r in pending), timeout_s)
            for (row, _), result in zip(pending, results, strict=True):
                history[row].append(result)
            pending = [(row, replace(requests[row], job_id=f"{requests[row].job_id}-re{resubmit}"))
                       for (row, _), result in zip(pending, results, strict=True) if not is_trainable(result)]
            if not pending or resubmit > max_resubmits:
                break
        return history

    async def cancel(self, job_ids: str | Iterable[str]) -> CancelOutcome:
        """Cancel jobs not yet ended; ended ones are reported with their status."""
        ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
        if not ids:
            return CancelOutcome([], {})
        reply = (await self.request("POST", "/cancel", json={"job_ids": ids})).json()
        return CancelOutcome(reply["cancelled"], reply["not_cancelled"])

    async def fork(self, job_id: str, turn: int, count: int, *, group_id: str | None = None) -> list[str]:
        """``count`` jobs sharing turns 1..``turn`` of an ended or running job, each going on with
        its own sampling (one group: ids ``<group_id>-<i>``); the shared turns are taken from the
        job's journal, never generated again.

        ``group_id`` (default: a fresh ``<job>-fork<turn>-<tag>``, made once, before the first
        attempt) makes the call idempotent: the retries after a lost reply or a 503, and a repeat
        of the call with the same ``group_id``, find the same forks and start none. Conflict when
        ``group_id`` already names forks of another source, turn or count."""
        group = group_id or new_group_id(job_id, turn)
        reply = await self.request("POST", f"/jobs/{quote(job_id, safe='')}/fork",
                                   json={"turn": turn, "count": count, "group_id": group})
        return [job["job_id"] for job in reply.json()["jobs"]]

    async def replay(self, job_ids: str | Iterable[str]) -> list[str]:
        """Replay finished jobs through fresh sandboxes with their recorded model outputs (no LLM),
        then EVAL again: the replays' ids, in order; each result's ``replay`` says what differs
        and holds ``reward_then`` and ``reward_now`` (re-scoring after an evaluator fix)."""
        ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
        reply = await self.request("POST", "/jobs/replay", json={"job_ids": ids})
        return [job["job_id"] for job in reply.json()["jobs"]]

    # -- backends and status -----------------------------------------------------------------------

    async def add_llm_server(self, address: str, type: str = "vllm") -> dict[str, Any]:
        """Register a backend (idempotent); returns ``{"address", "type", "added", "generation",
        "healthy", ...}``, with ``warning`` (also logged) when it did not answer its probe."""
        reply = (await self.request("POST", "/add_llm_server", json={"address": address, "type": type})).json()
        if reply.get("warning"):
            log.warning("%s", reply["warning"])
        return reply

    async def remove_llm_server(self, address: str) -> bool:
        """Stop routing new jobs to one backend (``POST /clear_llm_server {"address"}``; jobs in
        flight keep it); True if it was registered."""
        reply = (await self.request("POST", "/clear_llm_server", json={"address": address})).json()
        return bool(reply.get("removed"))

    async def clear_llm_servers(self) -> int:
        """Forget every backend; returns the new generation. Retried only if never sent."""
        return (await self.request("POST", "/clear_llm_server", idempotent=False)).json()["generation"]

    async def set_policy_version(self, version: int, address: str | None = None) -> dict[str, int]:
        """Tell the gateway that ``address`` (default: every registered backend) serves policy
        ``version`` now (``POST /llm_servers/version``, an admin route): every model turn from
        then on records it. Returns the backends' versions, address -> version. BadRequest when
        ``address`` is not registered."""
        body: dict[str, Any] = {"version": version}
        if address is not None:
            body["address"] = address
        return (await self.request("POST", "/llm_servers/version", json=body)).json()["versions"]

    async def llm_servers(self) -> dict[str, Any]:
        """The registered backends (``GET /llm_servers``)."""
        return (await self.request("GET", "/llm_servers")).json()

    async def status(self) -> dict[str, Any]:
        """The service's status (``GET /status``): job counts, workers, backends."""
        return (await self.request("GET", "/status")).json()


class LoopThread:
    """An event loop on a daemon thread; ``run`` executes a coroutine there and blocks."""

    def __init__(self, name: str = "prorl-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class RolloutClient:
    """Blocking client of one rollout deployment: the methods of :class:`AsyncRolloutClient`,
    run on an event loop of its own thread, so that a training loop need not be asyncio.

    ``urls`` is one gateway URL or several (tried in turn when one does not answer); ``options``
    are :class:`AsyncRolloutClient`'s (``token``, ``retry``, ``timeout_s``, ...). Use it as a
    context manager, or call :meth:`close`::

        with RolloutClient("http://127.0.0.1:8080") as client:
            job_id = client.submit({"data_source": "math", "problem": "What is 2 + 3?", "answer": "5"},
                                   sampling_params={"max_tokens": 256})
            result = client.wait(job_id)          # the result dict: docs/api.md
            reward = reward_of(result)            # None when the reward is not valid
    """

    def __init__(self, urls: str | Sequence[str], **options: Any) -> None:
        self._thread = LoopThread()
        try:
            self.aio: AsyncRolloutClient = self._thread.run(_make_async(urls, options))
        except BaseException:
            self._thread.close()
            raise

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the client's thread (idempotent)."""
        if not self._thread.loop.is_closed():
            self._thread.run(self.aio.aclose())
            self._thread.close()

    def run(self, coro: Awaitable[T]) -> T:
        """Run a coroutine of :attr:`aio` (or anything else) on the client's loop."""
        return self._thread.run(coro)

    @property
    def urls(self) -> list[str]:
        """The gateway URLs, in the order they are tried."""
        return self.aio.urls

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, instance: dict[str, Any], *, sampling_params: dict[str, Any] | None = None,
               job_id: str | None = None, task: str | None = None, timeout_s: float | None = None) -> str:
        """Create one job (``POST /jobs``) and return its id at once, without waiting.

        ``instance`` is the task instance itself (``{"data_source": "math", "problem": ..., "answer":
        ...}``), not a request body; ``sampling_params`` holds the sampler's keys (``max_tokens``,
        ``temperature``, ...) and agent keys; ``job_id`` makes the call idempotent (default: a
        fresh id); ``task`` names the handler when ``instance.data_source`` does not; ``timeout_s``
        is the job's active-time budget."""
        return self.run(self.aio.submit(instance, sampling_params=sampling_params, job_id=job_id, task=task,
                                        timeout_s=timeout_s))

    def submit_request(self, request: JobRequest) -> str:
        """Create the job a :class:`JobRequest` describes; returns its id."""
        return self.run(self.aio.submit_request(request))

    def submit_many(self, requests: Iterable[JobRequest], batch_size: int = 500) -> list[str]:
        """Create every job, ``batch_size`` per request; the ids in the order given. Ids are fixed
        in each :class:`JobRequest`, so retrying after a failure never runs a job twice."""
        return self.run(self.aio.submit_many(list(requests), batch_size=batch_size))

    def submit_group(self, instance: dict[str, Any], num_samples: int, *,
                     sampling_params: dict[str, Any] | None = None, group_id: str | None = None,
                     task: str | None = None, timeout_s: float | None = None) -> list[str]:
        """``num_samples`` rollouts of one instance (a GRPO group) in one request; returns the ids
        ``<group_id>-<i>``, and each result's ``trajectory_id`` is ``i``."""
        return self.run(self.aio.submit_group(instance, num_samples, sampling_params=sampling_params,
                                              group_id=group_id, task=task, timeout_s=timeout_s))

    def poll(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The job's result if it has ended within ``wait_s``, else its pending record (``status``,
        ``stage``, ``timing``); never raises for a job still running."""
        return self.run(self.aio.poll(job_id, wait_s))

    def wait(self, job_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until the job ends and return its result (every field: docs/api.md). Raises
        :class:`WaitTimeout` after ``timeout_s`` (None: no limit), JobNotFound for an unknown id."""
        return self.run(self.aio.wait(job_id, timeout_s))

    def wait_all(self, job_ids: Sequence[str], timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Every job's result, in the order of ``job_ids``, over one streamed request per 10,000."""
        return self.run(self.aio.wait_all(job_ids, timeout_s))

    def as_completed(self, job_ids: Iterable[str], timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield each job's result as it ends, in the order they end; leaving the loop early
        stops the waiting (the jobs go on: :meth:`cancel` them if they are no longer wanted)."""
        results = self.aio.as_completed(list(job_ids), timeout_s)
        try:
            while True:
                try:
                    yield self.run(results.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self.run(results.aclose())

    def process(self, instance: dict[str, Any], *, sampling_params: dict[str, Any] | None = None,
                job_id: str | None = None, task: str | None = None, timeout_s: float | None = None,
                wait_timeout_s: float | None = None) -> dict[str, Any]:
        """Submit one job and wait for its result (``submit`` then ``wait``); unlike ``POST
        /process``, a dropped connection does not lose the job, since the wait resumes by id."""
        return self.run(self.aio.process(instance, sampling_params=sampling_params, job_id=job_id, task=task,
                                         timeout_s=timeout_s, wait_timeout_s=wait_timeout_s))

    def run_until_valid(self, requests: Sequence[JobRequest], *, max_resubmits: int = 0,
                        timeout_s: float | None = None) -> list[list[dict[str, Any]]]:
        """:meth:`AsyncRolloutClient.run_until_valid`: every result of every request, resubmitting
        those whose reward is not valid up to ``max_resubmits`` times."""
        return self.run(self.aio.run_until_valid(requests, max_resubmits=max_resubmits, timeout_s=timeout_s))

    def cancel(self, job_ids: str | Iterable[str]) -> CancelOutcome:
        """Cancel one job or many. Returns which were cancelled, and for the others the status
        they had (``completed``, ..., or ``not_found``); a cancelled job ends ``cancelled``."""
        return self.run(self.aio.cancel(job_ids))

    def fork(self, job_id: str, turn: int, count: int, *, group_id: str | None = None) -> list[str]:
        """``count`` jobs sharing turns 1..``turn`` of an ended or running job, each with its own
        sampling from there; returns their ids ``<group_id>-<i>`` (one group). Wait for them as for
        any job. Idempotent under ``group_id`` (default: one made before the first attempt, so the
        client's own retries never start a second set): :meth:`AsyncRolloutClient.fork`."""
        return self.run(self.aio.fork(job_id, turn, count, group_id=group_id))

    def replay(self, job_ids: str | Iterable[str]) -> list[str]:
        """Replay finished jobs (recorded model outputs, a fresh sandbox, EVAL again); returns the
        replays' ids in order. Each result's ``replay`` field lists the observations that differ
        and the reward then against now."""
        return self.run(self.aio.replay(job_ids))

    # -- backends and status -----------------------------------------------------------------------

    def add_llm_server(self, address: str, type: str = "vllm") -> dict[str, Any]:
        """Register an LLM server (``http://host:port/v1``; ``type``: ``vllm``, ``sglang`` or
        ``llamacpp``); idempotent. Returns its entry with its health."""
        return self.run(self.aio.add_llm_server(address, type))

    def remove_llm_server(self, address: str) -> bool:
        """Stop routing new jobs to one LLM server (jobs in flight keep it); True if it was
        registered."""
        return self.run(self.aio.remove_llm_server(address))

    def clear_llm_servers(self) -> int:
        """Forget every LLM server; returns the new generation."""
        return self.run(self.aio.clear_llm_servers())

    def set_policy_version(self, version: int, address: str | None = None) -> dict[str, int]:
        """:meth:`AsyncRolloutClient.set_policy_version`: the policy version a backend serves now."""
        return self.run(self.aio.set_policy_version(version, address))

    def llm_servers(self) -> dict[str, Any]:
        """The registered LLM servers, each with its assignments, jobs in flight, version and
        health (``GET /llm_servers``)."""
        return self.run(self.aio.llm_servers())

    def status(self) -> dict[str, Any]:
        """The service's status (``GET /status``): jobs by status and outcome, queues, workers,
        backends."""
        return self.run(self.aio.status())


def _stream_outcome(line: str, left: dict[str, None], final: bool,
                    ) -> tuple[str, dict[str, Any] | ProrlError] | None:
    """One line of ``POST /jobs/wait`` as ``(job_id, outcome)``; None for a keep-alive, a job
    not asked for (any more), or a pending job whose wait goes on in the next window."""
    if not line.strip():
        return None
    reply = json.loads(line)
    job_id = reply.get("job_id")
    if job_id not in left:
        return None
    status = reply.get("status")
    if status is None and "code" in reply:  # the 404 body of an unknown id
        cls = SERVER_ERRORS.get(str(reply["code"]), JobNotFound)
        return job_id, cls(str(reply.get("message", job_id)))
    if status in TERMINAL_STATUSES:
        return job_id, reply
    return (job_id, WaitTimeout(job_id, status)) if final else None


async def _make_async(urls: str | Sequence[str], options: dict[str, Any]) -> AsyncRolloutClient:
    return AsyncRolloutClient(urls, **options)  # built on its loop: the semaphores belong there


def distribute_backends(deployments: Mapping[str, RolloutClient], backends: Sequence[str], *,
                        type: str = "vllm", clear: bool = True) -> dict[str, list[str]]:
    """Assign ``backends`` to deployments (same node first, then round robin; see
    :mod:`prorl_celery.trainer.assignment`) and register each share with its deployment.

    ``deployments`` maps a name holding the node's address (its gateway URL) to its client.
    With ``clear``, each deployment's old backends are cleared first (after a weight update).
    """
    from prorl_celery.trainer.assignment import assign_backends

    plan = assign_backends(list(deployments), backends)
    for name, share in plan.items():
        client = deployments[name]
        if clear:
            client.clear_llm_servers()
        for address in share:
            client.add_llm_server(address, type)
    return plan


async def adistribute_backends(deployments: Mapping[str, AsyncRolloutClient], backends: Sequence[str], *,
                               type: str = "vllm", clear: bool = True) -> dict[str, list[str]]:
    """:func:`distribute_backends` for asyncio clients."""
    from prorl_celery.trainer.assignment import assign_backends

    plan = assign_backends(list(deployments), backends)
    for name, share in plan.items():
        client = deployments[name]
        if clear:
            await client.clear_llm_servers()
        for address in share:
            await client.add_llm_server(address, type)
    return plan
