"""What RUN does with the job's journal: take it over, resume from it, or start it afresh.

A RUN stage takes the job's journal over for its attempt (``state.journal.JournalStore.begin``).
When it holds turns of an earlier attempt (the worker died, the node was lost, the service was
stopped, a backend failed), and the handler declares its tools replayable, RUN resumes: its
sandbox is fresh (INIT's steps ran again), the handler runs from the start, every model turn the
journal holds is taken from it (no token is generated twice) and every journaled action is
carried out again, its observation checked against the journal. When one differs, RUN restarts
from turn zero on a fresh sandbox (``ReplayDiverged``; the pipeline does it). What happened is
the result's ``resume`` field:

    {"resumed": true, "from_turn": 5, "replayed_turns": 5, "replayed_tokens": 812, "observations_checked": 4,
     "observations_normalised": 4, ...}   # 4 equal only past the program's volatile fields
    {"resumed": false, "restarted": true, "diverged_at_turn": 3, "difference": {...}, ...}
    {"resumed": false, "journaled_turns": 4, "reason": "the handler's tools are not replayable"}
"""
from __future__ import annotations

import asyncio
from typing import Any

from handlers import AgentHandler, JobContext
from handlers.volatile import VolatileField
from prorl_celery.llm.journal import TurnJournal
from prorl_celery.services import Services
from prorl_celery.wire.derived import shared_prefix


def turns_in(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["k"] == "gen")


async def take_journal(services: Services, handler: AgentHandler, job: JobContext, origin: dict[str, Any] | None,
                       *, fresh: bool = False) -> tuple[TurnJournal | None, dict[str, Any] | None]:
    """This RUN's journal writer (replaying the journal's turns when it resumes, or the source's
    when the job is a replay or a fork: ``origin``), and what the result says of a resume not
    taken; (None, None) when journaling is off (a replay or fork still reads its source)."""
    store = services.journal
    kind = (origin or {}).get("kind")
    if not services.settings.journal and kind is None:
        return None, None
    volatile = volatile_fields(handler, job)
    taken = await asyncio.to_thread(store.begin, job.job_id, job.attempt, fresh=fresh)
    write = store.append_on_loop if services.settings.journal else None
    if not taken.events and kind is not None and not fresh:
        assert origin is not None
        source = await asyncio.to_thread(store.read, origin["of"])
        if kind == "replay":  # every turn from the journal, never live; differences recorded
            return TurnJournal(job.job_id, job.attempt, write, replay=source, strict=False,
                               live_after_replay=False, volatile=volatile), None
        # a fork: the shared turns, checked as a resume's are, then its own
        return TurnJournal(job.job_id, job.attempt, write, replay=shared_prefix(source, origin["turn"]),
                           volatile=volatile), None
    if not taken.events:
        return TurnJournal(job.job_id, job.attempt, write), None
    if not handler.replayable(job):
        await asyncio.to_thread(store.begin, job.job_id, job.attempt, fresh=True)
        return TurnJournal(job.job_id, job.attempt, write), {
            "resumed": False, "journaled_turns": turns_in(taken.events),
            "reason": f"task {job.task!r} does not declare its tools replayable: the rollout started "
                      f"again from turn zero"}
    return TurnJournal(job.job_id, job.attempt, write, index=len(taken.events), replay=taken.events,
                       replay_own=True, strict=True, volatile=volatile), None


def volatile_fields(handler: AgentHandler, job: JobContext) -> tuple[VolatileField, ...]:
    """What the job's program's own tools make different on every run, as its handler declares
    it through the endpoint it asks for (none without one: every character is compared)."""
    request = handler.endpoint_request(job)
    return request.volatile_fields if request is not None else ()


async def settle(services: Services, journal: TurnJournal) -> dict[str, Any] | None:
    """After a RUN that replayed without diverging: what the result says of the resume, and the
    journal cut to what this run reached (its rollout may have ended sooner)."""
    if not journal.replay_own or not journal.replay:
        return None
    if journal.unreplayed:
        await asyncio.to_thread(services.journal.truncate, journal.job_id, journal.attempt, journal.cursor)
    replayed = [e for e in journal.replay[:journal.cursor] if e["k"] == "gen"]
    return {"resumed": True, "from_turn": len(replayed), "replayed_turns": len(replayed),
            "replayed_tokens": sum(len(e["ids"]) for e in replayed),
            "observations_checked": journal.checked, **_normalised(journal), "unreplayed_events": journal.unreplayed}


def origin_report(journal: TurnJournal, origin: dict[str, Any]) -> dict[str, Any]:
    """What a replay found (observation by observation) or what a fork shared."""
    replayed = [e for e in journal.replay[:journal.cursor] if e["k"] == "gen"]
    if origin.get("kind") == "fork":
        return {"shared_turns": len(replayed), "shared_tokens": sum(len(e["ids"]) for e in replayed),
                "observations_checked": journal.checked, **_normalised(journal)}
    observations = [d for d in journal.differences if d.kind.endswith("observation")]
    return {"turns_replayed": len(replayed), "observations_checked": journal.checked,
            **_normalised(journal), "observations_differing": len(observations), "differences_total": journal.different,
            "identical": journal.different == 0, "differences": [d.as_dict() for d in journal.differences],
            "unreplayed_events": journal.unreplayed}


def _normalised(journal: TurnJournal) -> dict[str, int]:
    """How many observations were equal only past the volatile fields; said only by a job whose
    handler declared some, so every other job's report stays as it was."""
    return {"observations_normalised": journal.normalised} if journal.volatile else {}


def restarted(journal: TurnJournal) -> dict[str, Any]:
    """What the result says of a resume that met a different observation."""
    assert journal.diverged is not None
    return {"resumed": False, "restarted": True, "diverged_at_turn": journal.diverged.turn,
            "difference": journal.diverged.as_dict(), "journaled_turns": turns_in(journal.replay),
            "reason": "a replayed observation differs from the journal's (a tool that is not "
                      "deterministic): the rollout started again from turn zero on a fresh sandbox"}
