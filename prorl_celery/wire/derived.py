"""Jobs made from another job's journal: replays and forks (``docs/journal.md``).

A **replay** re-drives a finished job's trajectory through a fresh sandbox with the recorded
model outputs (no LLM is asked), then runs EVAL again: its result's ``replay`` field says, for
each observation, where the environment now answers differently, and the reward then against
the reward now (re-scoring after an evaluator fix, or debugging a reward).

A **fork** starts ``count`` jobs that share turns 1..k of an ended or running job: the same
prompt and response ids (taken from the journal, never generated again) and the same sandbox
state (rebuilt by replaying the journaled actions on a fresh sandbox); each then goes on with
its own sampling. They form a group, ``<job>-fork<k>-<tag>``, with ids ``<group>-<i>``, and are routed to the
source's backend while it is registered and healthy (``prefer_backend``), whose prefix cache holds
the shared turns.

Both are ordinary jobs (INIT, RUN, EVAL) whose record names where they come from (``origin``);
RUN reads the source's journal (``prorl_celery.worker.resume``).
"""
from __future__ import annotations

import uuid
from typing import Any

from prorl_celery.core.errors import BadRequest
from prorl_celery.state.journal import JournalStore
from prorl_celery.state.store import JobRecord, JobStore
from prorl_celery.wire.job_intake import JobSpec
from prorl_celery.wire.results import ending_of

#: most forks one request may start
MAX_FORKS = 64


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


def fork_specs(store: JobStore, journal: JournalStore, job_id: str, turn: int, count: int) -> list[JobSpec]:
    """``count`` forks of ``job_id`` at ``turn`` (0: the prompt only)."""
    if not 1 <= count <= MAX_FORKS:
        raise BadRequest(f"count: 1 to {MAX_FORKS} forks, got {count}")
    record, events = _source(store, journal, job_id)
    turns = journaled_turns(events)
    if not 0 <= turn <= turns:
        raise BadRequest(f"turn: job {job_id!r} has {turns} journaled turns; fork at 0 to {turns}, got {turn}")
    group = f"{job_id}-fork{turn}-{uuid.uuid4().hex[:6]}"
    specs = []
    for i in range(count):
        sampler = dict(record.sampling_params)
        if sampler.get("seed") is not None:  # each fork its own sampling, reproducibly
            sampler["seed"] = int(sampler["seed"]) + 1 + i
        origin = {"kind": "fork", "of": job_id, "turn": turn, "group": group, "index": i}
        specs.append(JobSpec(f"{group}-{i}", record.task, {**record.instance, "trajectory_id": i}, sampler,
                             record.agent_params, record.ignored_params, record.budget_s, record.max_attempts,
                             origin, prefer_backend=record.backend))
    return specs


def shared_prefix(events: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The events of turns 1..``turn`` and what followed them, up to the next model turn."""
    seen = 0
    for index, event in enumerate(events):
        if event["k"] == "gen":
            if seen == turn:
                return events[:index]
            seen += 1
    return list(events)
