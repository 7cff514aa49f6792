"""Jobs made from another job's journal: replays and forks (``docs/journal.md``).

A **replay** re-drives a finished job's trajectory through a fresh sandbox with the recorded
model outputs (no LLM is asked), then runs EVAL again: its result's ``replay`` field says, for
each observation, where the environment now answers differently, and the reward then against
the reward now (re-scoring after an evaluator fix, or debugging a reward).

A **fork** starts ``count`` jobs that share turns 1..k of an ended or running job: the same
prompt and response ids (taken from the journal, never generated again) and the same sandbox
state (rebuilt by replaying the journaled actions on a fresh sandbox); each then goes on with
its own sampling. They form a group, ``<job>-fork<k>-<tag>`` or the client's ``group_id``, with ids
``<group>-<i>``, and are routed to the source's backend while it is registered and healthy
(``prefer_backend``), whose prefix cache holds the shared turns. A client-given ``group_id`` makes
the fork request idempotent (``submit_forks``).

Both are ordinary jobs (INIT, RUN, EVAL) whose record names where they come from (``origin``);
RUN reads the source's journal (``prorl_celery.worker.resume``).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from prorl_celery.core.errors import BadRequest, Conflict
from prorl_celery.core.forks import MAX_FORKS, fork_job_id, new_group_id
from prorl_celery.state.journal import JournalStore
from prorl_celery.state.store import JobRecord, JobStore
from prorl_celery.wire.job_intake import JobSpec, Submitted
from prorl_celery.wire.results import ending_of


def journaled_turns(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["k"] == "gen")


def _source(store: JobStore, journal: JournalStore, job_id: str) -> tuple[JobRecord, list[dict[str, Any]]]:
    record = store.load(job_id)  # JobNotFound: 404
    events = journal.read(job_id)
    if not events:
        raise BadRequest(f"job {job_id!r} has no journal: its task asks no LLM, it never reached RUN, "
                         f"journaling was off (PRORL_JOURNAL), or the journal expired with the job")
    return record, events


def replay_spec(store: JobStore, journal: JournalStore, job_id: str) -> JobSpec:
    """A replay of ended job ``job_id`` (BadRequest when it has not ended or has no journal)."""
    record, events = _source(store, journal, job_id)
    if not record.status.terminal:
        raise BadRequest(f"job {job_id!r} is {record.status.value}: a replay re-drives a finished "
                         f"trajectory (fork a running job instead)")
    ending = ending_of(record)
    then = record.reward if ending.outcome.reward_valid and record.reward is not None else None
    origin = {"kind": "replay", "of": job_id, "reward_then": then, "turns_then": journaled_turns(events)}
    # one attempt: a replay that failed is reported as such, never run again against the source
    return JobSpec(f"{job_id}-replay-{uuid.uuid4().hex[:8]}", record.task, record.instance, record.sampling_params,
                   record.agent_params, record.ignored_params, record.budget_s, 1, origin)


def fork_specs(store: JobStore, journal: JournalStore, job_id: str, turn: int, count: int,
               group_id: str | None = None) -> list[JobSpec]:
    """``count`` forks of ``job_id`` at ``turn`` (0: the prompt only), jobs ``<group>-<i>``;
    ``group_id`` is the client's (default: a fresh ``<job>-fork<k>-<tag>``)."""
    if not 1 <= count <= MAX_FORKS:
        raise BadRequest(f"count: 1 to {MAX_FORKS} forks, got {count}")
    record, events = _source(store, journal, job_id)
    turns = journaled_turns(events)
    if not 0 <= turn <= turns:
        raise BadRequest(f"turn: job {job_id!r} has {turns} journaled turns; fork at 0 to {turns}, got {turn}")
    group = group_id or new_group_id(job_id, turn)
    specs = []
    for i in range(count):
        sampler = dict(record.sampling_params)
        if sampler.get("seed") is not None:  # each fork its own sampling, reproducibly
            sampler["seed"] = int(sampler["seed"]) + 1 + i
        origin = {"kind": "fork", "of": job_id, "turn": turn, "group": group, "index": i, "count": count}
        specs.append(JobSpec(fork_job_id(group, i), record.task, {**record.instance, "trajectory_id": i}, sampler,
                             record.agent_params, record.ignored_params, record.budget_s, record.max_attempts,
                             origin, prefer_backend=record.backend))
    return specs


def fork_conflict(group_id: str, wanted: Mapping[str, Any], record: JobRecord) -> str | None:
    """What differs between the fork request ``wanted`` (``of``, ``turn``, ``count``) and the job
    ``record`` already under one of its ids; None when that job is the same request's fork."""
    origin = record.origin or {}
    if origin.get("kind") != "fork" or origin.get("group") != group_id:
        return (f"group_id {group_id!r}: job {record.id!r} already exists and is not one of its forks; "
                f"choose another group_id")
    differs = [f"{key} {origin.get(key)!r} (this request: {wanted[key]!r})"
               for key in FORK_KEYS if origin.get(key) != wanted[key]]
    if not differs:
        return None
    return (f"group_id {group_id!r} already names forks of another request: " + ", ".join(differs) +
            "; a group_id names one fork request, so repeat that request exactly or choose another group_id")


#: what makes two fork requests under one group_id the same request
FORK_KEYS = ("of", "turn", "count")
Submit = Callable[[list[JobSpec]], list[Submitted]]


def submit_forks(store: JobStore, journal: JournalStore, submit: Submit, job_id: str, turn: int, count: int,
                 group_id: str | None = None) -> tuple[str, list[Submitted]]:
    """Fork ``job_id`` (``fork_specs``) and submit the forks: the group id and each fork's fate.

    With a client-given ``group_id`` the request is idempotent, as ``POST /jobs`` with a given
    ``job_id`` is: the forks' ids derive from it, so a repeated request finds its jobs (``created``
    false) and starts none; a request that differs from the one that made them (another source,
    turn or count) is a Conflict and starts nothing."""
    if group_id is None:
        specs = fork_specs(store, journal, job_id, turn, count)
        return specs[0].origin["group"], submit(specs)  # type: ignore[index]
    wanted = {"of": job_id, "turn": turn, "count": count}
    ids = [fork_job_id(group_id, i) for i in range(count)]
    found = dict(zip(ids, store.load_many(ids)))
    _refuse_conflicts(group_id, wanted, [r for r in found.values() if r is not None])
    if all(found.values()):  # a repeat: answered from the records, the source's journal not read again
        return group_id, [Submitted(i, False, r.status) for i, r in found.items() if r is not None]
    submitted = submit(fork_specs(store, journal, job_id, turn, count, group_id))
    # another request under this group_id may have created some of them between the check and
    # the submit: its jobs are checked too, and this request's own are cancelled on a conflict
    raced = [s.job_id for s in submitted if not s.created and found[s.job_id] is None]
    try:
        _refuse_conflicts(group_id, wanted, [r for r in store.load_many(raced) if r is not None] if raced else [])
    except Conflict:
        for mine in (s.job_id for s in submitted if s.created):
            store.cancel(mine, f"group_id {group_id!r} conflicts with another fork request")
        raise
    return group_id, submitted


def _refuse_conflicts(group_id: str, wanted: Mapping[str, Any], records: list[JobRecord]) -> None:
    for record in records:
        conflict = fork_conflict(group_id, wanted, record)
        if conflict:
            raise Conflict(conflict)


def shared_prefix(events: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The events of turns 1..``turn`` and what followed them, up to the next model turn."""
    seen = 0
    for index, event in enumerate(events):
        if event["k"] == "gen":
            if seen == turn:
                return events[:index]
            seen += 1
    return list(events)
