"""The job store: job records, status transitions, the PausableTimer and completion signals.

All keys come from :mod:`prorl_celery.state.keys`; every multi-step update is one Lua script
(see ``lua/``), so that two workers, a redelivered message and a ``/cancel`` racing each other
still leave exactly one outcome.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import msgspec
import redis

from prorl_celery.core.errors import JobNotFound, ServiceStopped
from prorl_celery.core.outcomes import Ending, Outcome
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import ALLOWED_FROM, EXECUTING, WAITING_ON_NODE, JobStatus, Stage
from prorl_celery.state import keys
from prorl_celery.state.waiting import CompletionWaiter

#: job record fields stored as JSON text
JSON_FIELDS = frozenset(
    {"instance", "sampling_params", "agent_params", "ignored_params", "init_result", "run_result", "eval",
     "trajectory", "extra", "error", "sandbox", "attempts", "resume", "origin", "origin_report"}
)
FLOAT_FIELDS = frozenset(
    {"created_at", "status_at", "ended_at", "budget_s", "active_s", "init_s", "run_s", "eval_s", "reward"}
)
RECENT_JOBS_KEPT = 100_000
#: how long a transition keeps retrying while Redis is unreachable (a restart), before it raises
REDIS_OUTAGE_S = 30.0
_waiter_lock = threading.Lock()


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the store holds it, decoded once, with its fields as typed attributes.

    A field the hash lacks, or holds empty (the store writes None as ``""``), reads as its
    default. A field of the hash that no attribute names is not read (msgspec ignores it).
    """

    id: str
    task: str = ""
    status: JobStatus
    # the request
    instance: dict[str, Any] = {}
    sampling_params: dict[str, Any] = {}  # sampler keys (prorl_celery.llm.sampling)
    agent_params: dict[str, Any] = {}
    ignored_params: list[str] = []
    budget_s: float = 0.0
    attempt: int = 1  # > 1 once retried from INIT after a lost worker
    max_attempts: int = 1
    retry_reason: str | None = None
    cancel_requested: bool = False
    # the PausableTimer, in Redis time (seconds)
    created_at: float = 0.0
    status_at: float | None = None
    ended_at: float | None = None
    resumed_at: float | None = None  # set while a stage executes
    active_s: float = 0.0
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0
    lease_until: float | None = None
    # where the current attempt ran
    node: str | None = None
    init_node: str | None = None
    run_node: str | None = None
    eval_node: str | None = None
    worker_pid: int | None = None
    run_queue: str | None = None  # run.<node> for a node-local job
    sandbox: dict[str, Any] | None = None
    backend: str | None = None
    backend_protocol: str | None = None
    generation: int | None = None
    # what the stages produced
    init_result: dict[str, Any] = {}
    run_result: dict[str, Any] = {}
    trajectory: dict[str, Any] | None = None
    eval: dict[str, Any] = {}
    reward: float | None = None
    extra: dict[str, Any] = {}  # the handler's final_result
    #: what RUN did with the journal of an earlier attempt (prorl_celery.worker.resume)
    resume: dict[str, Any] | None = None
    #: a job made from another's journal: {"kind": "replay" | "fork", "of": job id, ...}
    #: (prorl_celery.wire.derived), and what its RUN found (the replay's differences, the fork's
    #: shared turns)
    origin: dict[str, Any] | None = None
    origin_report: dict[str, Any] | None = None
    critical_error: str | None = None  # the stage that failed, or "timeout"
    error: str | None = None
    # how the current attempt ended (prorl_celery.core.outcomes): set by whatever ends it
    outcome: str | None = None
    outcome_stage: str | None = None
    detail: str | None = None
    #: the attempts before the current one, each {attempt, outcome, stage, detail, node}
    attempts: list[dict[str, Any]] = []
    #: the node that ran the last failed attempt: a retry's INIT prefers another one
    avoid_node: str | None = None
    #: the attempt whose INIT this node already handed to another node once
    deferred_attempt: int | None = None
    transition_id: str | None = None

    def stage_node(self, stage: Stage) -> str | None:
        """The node that ran ``stage`` of the current attempt."""
        return {Stage.INIT: self.init_node, Stage.RUN: self.run_node, Stage.EVAL: self.eval_node}[stage]


def outcome(critical_error: str | None, error: str | None, ending: Ending | None = None,
            **fields: Any) -> dict[str, Any]:
    """The fields that say how a stage ended: ``critical_error`` names the stage that failed (or
    ``"timeout"``; None when none did), ``error`` says why and ``ending`` gives its class
    (``prorl_celery.core.outcomes``), beside any other ``fields``."""
    classed = ending.fields() if ending is not None else {}
    return {**fields, **classed, "critical_error": critical_error, "error": error}


#: fields of an attempt that a retry from INIT starts without: its outcome (no stage of the new
#: attempt has failed yet) and the stages' results. A retry of EVAL alone keeps them all (RUN's
#: own outcome, an agent_error, stays the job's; the failed EVAL wrote none)
RETRY_RESET = {"critical_error": None, "error": None, "outcome": None, "outcome_stage": None, "detail": None,
               "init_result": None, "run_result": None, "trajectory": None, "sandbox": None, "resume": None,
               "backend": "", "run_queue": "", "init_node": "", "run_node": "", "eval_node": ""}


def retry_fields(record_attempts: list[dict[str, Any]], attempt: int, ending: Ending, node: str | None,
                 *, from_init: bool = True) -> dict[str, Any]:
    """The fields that start attempt ``attempt + 1`` after ``ending`` ended ``attempt``: the
    reset, the counter, and the history with the ended attempt added."""
    history = [*record_attempts, {"attempt": attempt, "outcome": ending.outcome.value, "stage": ending.stage,
                                  "detail": ending.detail, "node": node}]
    return {**(RETRY_RESET if from_init else {}), "attempt": attempt + 1,
            "retry_reason": ending.detail, "attempts": history, "avoid_node": node or ""}


def load_script(client: redis.Redis, name: str):
    source = resources.files("prorl_celery.state").joinpath(f"lua/{name}.lua").read_text()
    return client.register_script(source)


def run_script_many(client: redis.Redis, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
    """``script`` once per ``(keys, args)`` in ``calls``, in one round trip; the replies in order.

    By the script's SHA alone: redis-py's pipeline first asks ``SCRIPT EXISTS`` for the scripts
    it carries, a round trip more per pipeline (on both sides: a batched hand-over, a grouped
    submit). A server that lacks the script (restarted, or its cache flushed) answers NOSCRIPT to
    those calls only, which are sent again once the script is loaded. Raises the first error
    among the replies, as a pipeline does."""
    pipe = client.pipeline(transaction=False)
    for call_keys, args in calls:
        pipe.evalsha(script.sha, len(call_keys), *call_keys, *args)
    replies = pipe.execute(raise_on_error=False)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)]
    if missing:
        script.sha = client.script_load(script.script)
        again = client.pipeline(transaction=False)
        for i in missing:
            call_keys, args = calls[i]
            again.evalsha(script.sha, len(call_keys), *call_keys, *args)
        for i, reply in zip(missing, again.execute(raise_on_error=False)):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


#: the stages whose queues workers consume without acks (``celery_app``): a message that leaves
#: the queue and is never claimed is found through the index of the jobs waiting for them
#: (``keys.unclaimed``) and published again (``leases.republish_lost``)
UNCLAIMED_STAGES: tuple[Stage, ...] = (Stage.INIT, Stage.EVAL)
#: the header a stage message carries the time it was sent in (its publisher's clock, unix
#: seconds; ``celery_app._send``): the reaper tells a lost message from one behind a backlog by it
SENT_HEADER = "prorl_sent_at"


def index_spec(lease_s: float) -> str:
    """The reaper's indexes as the scripts receive them (one ARGV, JSON): which statuses hold a
    lease and for how long a claim takes it, where jobs waiting for RUN are listed, and the
    index of each status waiting for a stage consumed without acks."""
    return json.dumps({"executing": sorted(s.value for s in EXECUTING), "lease_s": lease_s,
                       "waiting": WAITING_ON_NODE.value, "shared_queue": Stage.RUN.value,
                       "waiting_prefix": keys.WAITING_RUN,
                       "unclaimed": {s.pending.value: keys.unclaimed(s.pending.value) for s in UNCLAIMED_STAGES}})


#: a claim's lease for a store built without one (the services pass settings.lease_s)
DEFAULT_LEASE_S: float = Settings.model_fields["lease_s"].default


@dataclass(frozen=True)
class Transition:
    ok: bool
    previous: JobStatus | None  # None: the job does not exist
    budget_left_s: float = 0.0
    record: JobRecord | None = None  # the job record after a successful stage claim


@dataclass(frozen=True)
class Move:
    """One transition of ``JobStore.transition`` (see there), to send with others."""

    job_id: str
    target: JobStatus
    timer: str = "none"
    fields: dict[str, Any] | None = None
    only_from: JobStatus | None = None
    with_record: bool = False
    attempt: int | None = None

    @classmethod
    def hand_over(cls, job_id: str, stage: Stage, fields: dict[str, Any] | None = None,
                  attempt: int | None = None) -> Move:
        """``<stage>`` -> ``pending_<next>``, pausing the timer while the job waits in a queue."""
        assert stage.next is not None
        return cls(job_id, stage.next.pending, "pause", fields, attempt=attempt)

    @classmethod
    def finish(cls, job_id: str, status: JobStatus, fields: dict[str, Any] | None = None,
               attempt: int | None = None) -> Move:
        """End the job exactly once; wakes every waiter."""
        assert status.terminal
        return cls(job_id, status, "pause", fields, attempt=attempt)


@dataclass(frozen=True)
class StageTiming:
    init_s: float
    run_s: float
    eval_s: float
    active_s: float
    queued_s: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in self.__dict__.items()}


def _encode(fields: dict[str, Any]) -> list[str]:
    flat: list[str] = []
    for name, value in fields.items():
        if name in JSON_FIELDS:
            value = json.dumps(value)
        elif value is None:
            value = ""
        flat += [name, str(value)]
    return flat


_JSON = msgspec.json.Decoder()


def _loads(text: str) -> Any:
    """A JSON field's value: msgspec's decoder (a fifth of ``json.loads``' CPU on a 6.5 KB
    trajectory, and every stage claim and every answer decodes the record), ``json.loads`` for
    what msgspec refuses and ``_encode``'s ``json.dumps`` writes: NaN, +-Infinity (a logprob of
    -inf) and lone surrogates."""
    try:
        return _JSON.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def decode_record(raw: dict[str, str]) -> JobRecord:
    """The record of a job's hash (as HGETALL returns it)."""
    present: dict[str, Any] = {}
    for name, value in raw.items():
        if not value:  # the store writes None as ""
            continue
        if name in JSON_FIELDS:
            decoded = _loads(value)
            if decoded is not None and decoded != "":
                present[name] = decoded
        elif name in FLOAT_FIELDS:
            present[name] = float(value)
        else:
            present[name] = value
    # strict=False: the hash holds text, so "2" is read as the int 2 and "1" as True
    return msgspec.convert(present, JobRecord, strict=False)


class JobStore:
    """Job state in Redis. Thread-safe; share one per process."""

    def __init__(self, client: redis.Redis, *, result_ttl_s: int, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.redis = client
        self.result_ttl_s = result_ttl_s
        self.lease_s = lease_s  # a stage claim holds its lease this long (renewals extend it)
        self._index = index_spec(lease_s)
        self._create = load_script(client, "create_job")
        self._transition = load_script(client, "transition")
        self._waiter: CompletionWaiter | None = None

    # -- creation and reading ---------------------------------------------------------------

    def create(self, job_id: str, fields: dict[str, Any]) -> tuple[bool, JobStatus]:
        """Create a job in ``pending_init``; returns (created, status). Idempotent per id."""
        created, status = self._create(
            keys=self._create_keys(job_id),
            args=[job_id, RECENT_JOBS_KEPT, *_encode(fields)],
        )
        if created == -1:
            raise ServiceStopped("the service is stopped; POST /start to accept jobs again")
        return bool(created), JobStatus(status)

    def create_many(self, jobs: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, JobStatus]]:
        """``create`` for many jobs in one round trip; each is created (or found) on its own."""
        if len(jobs) == 1:
            return [self.create(*jobs[0])]
        replies = run_script_many(self.redis, self._create, [
            (self._create_keys(job_id), [job_id, RECENT_JOBS_KEPT, *_encode(fields)]) for job_id, fields in jobs])
        if any(created == -1 for created, _ in replies):
            raise ServiceStopped("the service is stopped; POST /start to accept jobs again")
        return [(bool(created), JobStatus(status)) for created, status in replies]

    @staticmethod
    def _create_keys(job_id: str) -> list[str]:
        return [keys.job(job_id), keys.STATUS_COUNTS, keys.RECENT_JOBS, keys.SERVICE_STATE, keys.ACTIVE_JOBS,
                keys.unclaimed(JobStatus.PENDING_INIT.value)]

    def load(self, job_id: str) -> JobRecord:
        raw = cast(dict[str, str], self.redis.hgetall(keys.job(job_id)))  # decode_responses
        if not raw:
            raise JobNotFound(f"no job with id {job_id!r} (unknown, or its result expired)")
        return decode_record(raw)

    def load_many(self, job_ids: list[str]) -> list[JobRecord | None]:
        """Many job records in one round trip (None: no such job, or its result expired)."""
        if len(job_ids) == 1:  # one HGETALL: a pipeline costs more than it saves for one
            raws = [cast(dict[str, str], self.redis.hgetall(keys.job(job_ids[0])))]
        else:
            pipe = self.redis.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hgetall(keys.job(job_id))
            raws = pipe.execute()
        return [decode_record(raw) if raw else None for raw in raws]

    def status(self, job_id: str) -> JobStatus | None:
        value = self.redis.hget(keys.job(job_id), "status")
        return JobStatus(value) if value else None

    def update(self, job_id: str, fields: dict[str, Any], *, attempt: int, status: JobStatus | None = None) -> bool:
        """Set fields on an existing record (a stage's results between transitions).

        Through the transition script's guard: the fields are written only while the job is on
        ``attempt`` (and in ``status``, when given), so a stage of an attempt that was given up
        cannot overwrite the retried job's. Returns whether they were written."""
        allowed = status.value if status is not None else ",".join(s.value for s in JobStatus)
        reply = self._transition(keys=self._transition_keys(job_id),
                                 args=[job_id, "", allowed, "none", 0, self.result_ttl_s, 0, attempt, "", 0,
                                       self._index, *_encode(fields)])
        return bool(reply[0])

    # -- transitions --------------------------------------------------------------------------

    def transition(
        self, job_id: str, target: JobStatus, *, timer: str = "none", fields: dict[str, Any] | None = None,
        only_from: JobStatus | None = None, with_record: bool = False, attempt: int | None = None,
    ) -> Transition:
        """Move the job to ``target`` if the table allows it from its current status
        (narrowed to ``only_from`` when given)."""
        return self.transition_many([Move(job_id, target, timer, fields, only_from, with_record, attempt)])[0]

    def transition_many(self, moves: list[Move]) -> list[Transition]:
        """``transition`` for many jobs in one round trip (one EVALSHA for one); each job moves
        or not on its own, and a reply lost to a Redis restart is found out per job."""
        calls = [self._call(move) for move in moves]
        results: list[Transition | None] = [None] * len(moves)
        pending = list(range(len(moves)))
        deadline = time.monotonic() + REDIS_OUTAGE_S
        while True:
            try:
                if len(pending) == 1:
                    job_keys, args, _ = calls[pending[0]]
                    replies = [self._transition(keys=job_keys, args=args)]
                else:
                    replies = run_script_many(self.redis, self._transition,
                                              [(calls[i][0], calls[i][1]) for i in pending])
                break
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                # each transition writes its own token, so that after a lost reply we can tell
                # whether it happened: a Redis restart must neither strand a job nor move it twice
                still = []
                for i in pending:
                    done = self._landed(moves[i].job_id, calls[i][2], moves[i].with_record)
                    if done is None:
                        still.append(i)
                    else:
                        results[i] = done
                pending = still
                if not pending:
                    return cast(list[Transition], results)
        for i, reply in zip(pending, replies):
            results[i] = self._decode(reply, moves[i].with_record)
        return cast(list[Transition], results)

    def _call(self, move: Move) -> tuple[list[str], list[Any], str]:
        """The transition script's keys and arguments for ``move``, and its token."""
        target = move.target
        sources = ALLOWED_FROM[target] & {move.only_from} if move.only_from else ALLOWED_FROM[target]
        allowed = ",".join(sorted(s.value for s in sources)) or "-"
        token = uuid.uuid4().hex
        args = [move.job_id, target.value, allowed, move.timer, int(target.terminal), self.result_ttl_s,
                int(move.with_record), "" if move.attempt is None else move.attempt, keys.MINUTE_STATS,
                keys.MINUTE_STATS_TTL_S, self._index, *_encode({**(move.fields or {}), "transition_id": token})]
        return self._transition_keys(move.job_id), args, token

    @staticmethod
    def _decode(reply: list[Any], with_record: bool) -> Transition:
        previous = JobStatus(reply[1]) if reply[1] else None
        if not reply[0]:
            return Transition(False, previous)
        record = decode_record(dict(zip(reply[4][::2], reply[4][1::2]))) if with_record else None
        return Transition(True, previous, float(reply[2]), record)

    @staticmethod
    def _transition_keys(job_id: str) -> list[str]:
        return [keys.job(job_id), keys.STATUS_COUNTS, keys.JOBS_ENDED, keys.ACTIVE_JOBS, keys.LEASES,
                keys.WAITING_RUN_QUEUES, keys.OUTCOME_COUNTS, keys.journal(job_id), keys.journal_meta(job_id)]

    def _landed(self, job_id: str, token: str, with_record: bool) -> Transition | None:
        """The transition whose reply was lost, if it took place (else None: send it again)."""
        try:
            raw = cast(dict[str, str], self.redis.hgetall(keys.job(job_id)))
        except (redis.ConnectionError, redis.TimeoutError):
            return None
        if raw.get("transition_id") != token:
            return None
        record = decode_record(raw)
        return Transition(True, None, record.budget_s - record.active_s, record if with_record else None)

    def claim_stage(self, job_id: str, stage: Stage, fields: dict[str, Any] | None = None) -> Transition:
        """``pending_<stage>`` -> ``<stage>`` and start the timer; fails for a redelivery.

        A successful claim carries the job record, read in the same script."""
        return self.claim_stages([job_id], stage, fields)[0]

    def claim_stages(self, job_ids: list[str], stage: Stage, fields: dict[str, Any] | None = None) -> list[Transition]:
        """``claim_stage`` for the jobs of one stage message, in one round trip."""
        return self.transition_many([Move(job_id, stage.active, "resume", fields, with_record=True)
                                     for job_id in job_ids])

    def hand_over(self, job_id: str, stage: Stage, fields: dict[str, Any] | None = None,
                  attempt: int | None = None) -> Transition:
        """``<stage>`` -> ``pending_<next>``, pausing the timer while the job waits in a queue."""
        return self.transition_many([Move.hand_over(job_id, stage, fields, attempt)])[0]

    def finish(self, job_id: str, status: JobStatus, fields: dict[str, Any] | None = None,
               attempt: int | None = None) -> Transition:
        """End the job exactly once; wakes every waiter."""
        return self.transition_many([Move.finish(job_id, status, fields, attempt)])[0]

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> Transition:
        """End a job as cancelled unless it has ended already, and tell its worker."""
        result = self.finish(job_id, JobStatus.CANCELLED, {"error": reason, "cancel_requested": 1,
                                                           **Ending(Outcome.CANCELLED, None, reason).fields()})
        if result.ok:
            self.redis.publish(keys.CANCEL_CHANNEL, job_id)
        return result

    def is_cancelled(self, job_id: str) -> bool:
        return self.redis.hget(keys.job(job_id), "status") in (None, JobStatus.CANCELLED.value)

    # -- timer ---------------------------------------------------------------------------------

    def timing(self, record: JobRecord, now: float | None = None) -> StageTiming:
        """Stage times of a record; the running stage counts up to ``now`` (Redis time)."""
        now = now if now is not None else self.server_time()
        per_stage = {Stage.INIT: record.init_s, Stage.RUN: record.run_s, Stage.EVAL: record.eval_s}
        active = record.active_s
        if record.resumed_at and record.status.value in {s.value for s in Stage}:
            running = now - record.resumed_at
            active += running
            per_stage[Stage(record.status.value)] += running
        end = record.ended_at or now
        queued = max(0.0, end - record.created_at - active)
        return StageTiming(per_stage[Stage.INIT], per_stage[Stage.RUN], per_stage[Stage.EVAL], active, queued)

    def server_time(self) -> float:
        seconds, micros = self.redis.time()
        return seconds + micros / 1e6

    def wait_replicated(self, replicas: int, timeout_ms: int) -> int:
        """How many replicas hold everything written to this Redis before the call, waiting up to
        ``timeout_ms`` for ``replicas`` of them (Redis ``WAIT``).

        WAIT waits for the offset of its own connection's last write, so a write goes first on
        the same connection: the replication stream is one ordered log, and a replica that has
        that write has every write that came before it, by any client and in any database (the
        broker's messages in db 0 as much as the job records in db 1)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(keys.REPLICATION_MARK)
        pipe.wait(replicas, timeout_ms)
        return int(pipe.execute()[-1])

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, job_id: str, timeout_s: float, *, exists: bool = False,
             registered: threading.Event | None = None) -> JobStatus:
        """Block until the job ends or ``timeout_s`` passes; returns its status then.

        The wait holds no Redis connection: this process's one listener wakes it when the job
        ends (:mod:`prorl_celery.state.waiting`), and its status is read before blocking, so a job
        that ended before the call is seen at once. ``exists``: the caller has just created
        the job; its status is read all the same (after registering the wait), since a short job
        may have ended already. ``registered``: ``self.waiter.register(job_id)``'s event, taken
        before the job was created: no status read at all then (the gateway's ``/process``).
        """
        status = self.waiter.wait(job_id, timeout_s, lambda: self.status(job_id), registered=registered)
        if status is None:
            raise JobNotFound(f"no job with id {job_id!r} (unknown, or its result expired)")
        return status

    @property
    def waiter(self) -> CompletionWaiter:
        with _waiter_lock:
            if self._waiter is None:
                self._waiter = CompletionWaiter(self.redis)
            return self._waiter

    def close(self) -> None:
        """Stop the completion listener, if a wait ever started one."""
        with _waiter_lock:
            if self._waiter is not None:
                self._waiter.close()

    # -- service state and statistics ------------------------------------------------------------

    def service_started(self) -> bool:
        return self.redis.get(keys.SERVICE_STATE) != "stopped"

    def set_service_state(self, started: bool) -> None:
        self.redis.set(keys.SERVICE_STATE, "started" if started else "stopped")

    def active_job_ids(self) -> list[str]:
        return sorted(cast(set[str], self.redis.smembers(keys.ACTIVE_JOBS)))

    def outcome_counts(self) -> dict[str, int]:
        """Outcome class -> jobs that ended with it (every class listed)."""
        counts = {o.value: 0 for o in Outcome}
        counts.update({k: int(v) for k, v in cast(dict[str, str], self.redis.hgetall(keys.OUTCOME_COUNTS)).items()})
        return counts

    def status_counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in JobStatus}
        counts.update({k: int(v) for k, v in cast(dict[str, str], self.redis.hgetall(keys.STATUS_COUNTS)).items()})
        return counts

    def recent_job_ids(self, limit: int = 100) -> list[str]:
        return cast(list[str], self.redis.zrevrange(keys.RECENT_JOBS, 0, limit - 1))
