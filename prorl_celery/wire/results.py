"""The final result of a job, as ``/process`` and ``GET /jobs/<id>`` return it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec

from prorl_celery.core.errors import JobNotFound
from prorl_celery.core.outcomes import Ending, Outcome, of_status
from prorl_celery.core.status import TERMINAL, Stage
from prorl_celery.state.store import JobRecord, JobStore
from prorl_celery.state.waiting import ManyWait
from prorl_celery.wire.v1 import v1_fields

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)
STAGE_NAMES = frozenset(s.value for s in Stage)
_ENCODER = msgspec.json.Encoder()
#: most records one pipelined read of POST /jobs/wait fetches (and one chunk carries): results
#: can be large, and 10,000 of them ended already would otherwise be read and held at once
REPORT_SLICE = 500


def ending_of(record: JobRecord) -> Ending:
    """How the job (or its current attempt) ended: as recorded, else (a record from before
    outcomes, or one ended where no class was given) from its status alone."""
    if record.outcome:
        return Ending(Outcome(record.outcome), record.outcome_stage, record.detail)
    critical = record.critical_error
    return Ending(of_status(record.status, critical=critical),
                  critical if critical in STAGE_NAMES else None, record.error)


def build_result(store: JobStore, record: JobRecord) -> dict[str, Any]:
    """Shape a job record into the result: our fields and the ProRL Agent Server v1 ones
    (``wire_v1``), well-formed in every status.

    ``outcome`` says how it ended (``prorl_celery.core.outcomes``); ``reward`` is a number only when
    ``reward_valid``, else null (v1's ``score`` stays a number, with ``filter: true``)."""
    status = record.status
    ending = ending_of(record)
    valid = ending.outcome.reward_valid and record.reward is not None
    reward = record.reward if valid else None
    timing = store.timing(record, now=record.ended_at).to_dict()
    extra = dict(record.extra)  # a copy: artifacts move out of it
    result: dict[str, Any] = {
        "job_id": record.id,
        "task": record.task,
        "status": status.value,
        "stage": status.stage.value if status.stage else None,
        "outcome": ending.outcome.value,
        "reward_valid": valid,
        "retryable": ending.outcome.retryable,
        "outcome_stage": ending.stage,
        "detail": ending.detail,
        "reward": reward,
        "instance_id": record.instance.get("instance_id"),
        "trajectory_id": record.instance.get("trajectory_id"),
        "critical_error": record.critical_error,
        "error": record.error,
        "timing": timing,
        "backend": record.backend,
        "generation": record.generation,
        "attempt": record.attempt,
        "attempts": [*record.attempts, {"attempt": record.attempt, "outcome": ending.outcome.value,
                                        "stage": ending.stage, "detail": ending.detail, "node": record.node}],
        "nodes": {stage.value: record.stage_node(stage) for stage in Stage},
        "trajectory": with_sample_rewards(record.trajectory, reward, record.eval),
        "resume": record.resume,
        **_origin(record, reward),
        "eval": record.eval,
        "artifacts": extra.pop("artifacts", {}),
        "ignored_sampling_params": record.ignored_params,
        **v1_fields(status=status.value, reward=reward if reward is not None else 0.0, reward_valid=valid,
                    trajectory=record.trajectory, run_result=record.run_result, timing=timing),
    }
    result.update({k: v for k, v in extra.items() if k not in result})
    return result


def with_sample_rewards(trajectory: dict[str, Any] | None, reward: float | None,
                        judgement: dict[str, Any] | None) -> dict[str, Any] | None:
    """A trajectory whose ``samples`` each carry their ``reward``: the handler's own for that
    sample (``sample_rewards`` of its judgement), else the rollout's; null when the rollout's
    reward is not valid."""
    samples = (trajectory or {}).get("samples")
    if not samples:
        return trajectory
    own = (judgement or {}).get("sample_rewards") or {}
    rewarded = [{**sample, "reward": None if reward is None else own.get(str(sample.get("sample", i)), reward)}
                for i, sample in enumerate(samples)]
    return {**trajectory, "samples": rewarded}  # type: ignore[dict-item]


def _origin(record: JobRecord, reward: float | None) -> dict[str, Any]:
    """A replay's or fork's own field: ``replay`` (with the reward now beside the reward then)
    or ``fork``; nothing for a job of its own."""
    if not record.origin:
        return {}
    kind = record.origin.get("kind", "origin")
    field = {**record.origin, **(record.origin_report or {})}
    field.pop("kind", None)
    if kind == "replay":
        field["reward_now"] = reward
    return {kind: field}


def pending_result(store: JobStore, record: JobRecord, now: float | None = None) -> dict[str, Any]:
    """What a caller sees while the job is still on its way (``now``: Redis time, if read)."""
    status = record.status
    return {"job_id": record.id, "status": status.value,
            "stage": status.stage.value if status.stage else None,
            "timing": store.timing(record, now=now).to_dict()}


def not_found_line(job_id: str) -> dict[str, Any]:
    """The line of ``POST /jobs/wait`` for an id with no job: the 404 body, naming the id."""
    return {"job_id": job_id, "code": JobNotFound.code,
            "message": f"no job with id {job_id!r} (unknown, or its result expired)"}


def results_as_they_end(store: JobStore, job_ids: list[str], timeout_s: float,
                        heartbeat_s: float) -> Iterator[bytes]:
    """``POST /jobs/wait``'s body: NDJSON, one line per job as it ends (the ``build_result`` of
    ``GET /jobs/<id>``), those ended already first; after ``timeout_s`` a ``pending_result``
    line for each job still running, then the end. A bare newline every ``heartbeat_s`` without
    an ending keeps proxies from closing the connection and lets the server find a client gone
    (a write fails and the server closes this generator, which unregisters every wait).

    No thread or connection per job: one ``ManyWait`` of the process's waiter, registered
    before the statuses are read (one pipelined round trip), so no ending is missed (see
    ``prorl_celery.state.waiting``); the records of the jobs one wake-up reports are read in one
    pipelined round trip too.
    """
    deadline = time.monotonic() + timeout_s
    many = store.waiter.register_many(job_ids)
    try:
        ids = many.job_ids
        statuses = store.waiter.read_statuses(ids)
        missing = [j for j, s in zip(ids, statuses) if s is None]
        many.drop(missing)
        left = {j for j, s in zip(ids, statuses) if s is not None}
        ended = [j for j, s in zip(ids, statuses) if s in TERMINAL_VALUES]
        if missing or not ended:  # at once, whatever comes next: the client sees the headers
            yield _ndjson([not_found_line(j) for j in missing]) or b"\n"
        yield from _reports(store, many, left, ended)
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ended = [j for j in dict.fromkeys(many.take(min(heartbeat_s, remaining))) if j in left]
            if ended:
                yield from _reports(store, many, left, ended)
            elif time.monotonic() < deadline:
                yield b"\n"
        pending = sorted(left)
        for start in range(0, len(pending), REPORT_SLICE):
            yield _ndjson(_at_the_deadline(store, pending[start:start + REPORT_SLICE]))
    finally:
        many.close()


def _reports(store: JobStore, many: ManyWait, left: set[str], job_ids: list[str]) -> Iterator[bytes]:
    """The lines of ``job_ids`` that ended, ``REPORT_SLICE`` records per read and chunk."""
    for start in range(0, len(job_ids), REPORT_SLICE):
        lines = _report(store, many, left, job_ids[start:start + REPORT_SLICE])
        if lines:
            yield _ndjson(lines)


def _report(store: JobStore, many: ManyWait, left: set[str], job_ids: list[str]) -> list[dict[str, Any]]:
    """The lines of the jobs of ``job_ids`` that have ended (read in one round trip); they leave
    ``left`` and stop being waited on. A job woken but not ended (it cannot un-end; a record
    re-created under its id after expiry could) stays."""
    if not job_ids:
        return []
    lines, done = [], []
    for job_id, record in zip(job_ids, store.load_many(job_ids)):
        line = _line(store, job_id, record)
        if line is not None:
            lines.append(line)
            done.append(job_id)
    left.difference_update(done)
    many.drop(done)
    return lines


def _at_the_deadline(store: JobStore, job_ids: list[str]) -> list[dict[str, Any]]:
    now = store.server_time()  # once: pending_result would ask Redis for each job
    lines = []
    for job_id, record in zip(job_ids, store.load_many(job_ids)):
        line = _line(store, job_id, record)
        if line is None:  # still running: _line answers for an unknown id itself
            assert record is not None
            line = pending_result(store, record, now=now)
        lines.append(line)
    return lines


def _line(store: JobStore, job_id: str, record: JobRecord | None) -> dict[str, Any] | None:
    """An ended job's line (or an unknown id's); None while the job runs."""
    if record is None:
        return not_found_line(job_id)
    return build_result(store, record) if record.status.terminal else None


def _ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(_ENCODER.encode(line) + b"\n" for line in lines)
