"""A job's per-turn journal in Redis (DESIGN decision 18): what a rollout did, turn by turn.

The journal is a list of JSON events (``prorl_celery.llm.journal`` says which), appended by the
RUN stage that owns it: the model's turn as soon as the backend returned it, the tool actions
and observations that follow before the next turn starts. Resume after a crash, replay, re-scoring
and forks read it. This module owns its keys (``keys.journal``, ``keys.journal_meta``); the job's
transition to a terminal status gives them the job's TTL (``lua/transition.lua``), so the journal
expires with the job.

Ownership: a RUN stage takes the journal over for its attempt (``begin``); an older attempt's
stage (its worker presumed lost, still running somewhere) can append nothing after that. Each
append names the index its first event takes, so a turn is never journaled twice nor skipped.
Bounds: ``max_events`` and ``max_bytes`` (``PRORL_JOURNAL_MAX_EVENTS``, ``PRORL_JOURNAL_MAX_BYTES``);
a journal that would pass them stops (``full`` says where) and the rollout goes on unjournaled
from there: a resume replays what was journaled and generates the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import msgspec
import redis

from prorl_celery.core.errors import JournalFenced
from prorl_celery.core.event_loops import Batched, loop_local
from prorl_celery.state import keys
from prorl_celery.state.store import load_script, run_script_many

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


def encode_event(event: dict[str, Any]) -> str:
    """One event as the journal stores it (floats round-trip exactly)."""
    return _ENCODE.encode(event).decode()


def decode_event(text: str | bytes) -> dict[str, Any]:
    return cast(dict[str, Any], _DECODE.decode(text))


@dataclass(frozen=True)
class Append:
    """Events of one job to append at ``index`` (the journal's length the writer expects)."""

    job_id: str
    attempt: int
    index: int
    events: list[str]


@dataclass(frozen=True)
class Appended:
    ok: bool
    length: int  # the journal's length after the append (or as found, when refused)
    refused: str | None = None  # fenced | order | full


@dataclass(frozen=True)
class Taken:
    """A journal as a RUN stage took it over: its events so far, and why it stopped if it did."""

    events: list[dict[str, Any]]
    full: str | None


class JournalStore:
    """Jobs' journals in Redis. Thread-safe; share one per process."""

    def __init__(self, client: redis.Redis, *, max_events: int, max_bytes: int) -> None:
        self.redis = client
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._append = load_script(client, "journal_append")
        self._begin = load_script(client, "journal_begin")
        self._truncate = load_script(client, "journal_truncate")

    @staticmethod
    def _keys(job_id: str) -> list[str]:
        return [keys.journal(job_id), keys.journal_meta(job_id)]

    def begin(self, job_id: str, attempt: int, *, fresh: bool = False) -> Taken:
        """Take ``job_id``'s journal over for ``attempt``, and read it; ``fresh`` empties it first
        (a rollout that starts from turn zero). JournalFenced when a later attempt owns it."""
        reply = self._begin(keys=self._keys(job_id), args=[attempt, int(fresh)])
        if not reply[0]:
            raise JournalFenced(f"job {job_id}: attempt {reply[1]} owns the journal, not attempt {attempt}")
        return Taken([decode_event(e) for e in reply[2:]], reply[1] or None)

    def read(self, job_id: str) -> list[dict[str, Any]]:
        """Every event of ``job_id``'s journal (empty: none, or it expired with the job)."""
        return [decode_event(e) for e in cast(list[str], self.redis.lrange(keys.journal(job_id), 0, -1))]

    def meta(self, job_id: str) -> dict[str, str]:
        return cast(dict[str, str], self.redis.hgetall(keys.journal_meta(job_id)))

    def append_many(self, appends: list[Append]) -> list[Appended]:
        """Each job's events in one round trip for all of them."""
        calls = [(self._keys(a.job_id), [a.attempt, a.index, self.max_events, self.max_bytes, *a.events])
                 for a in appends]
        if len(calls) == 1:  # one EVALSHA, as redis-py's Script sends it
            return [self._reply(self._append(keys=calls[0][0], args=calls[0][1]))]
        return [self._reply(reply) for reply in run_script_many(self.redis, self._append, calls)]

    @staticmethod
    def _reply(reply: list[Any]) -> Appended:
        if reply[0]:
            return Appended(True, int(reply[1]))
        return Appended(False, int(reply[2]), reply[1])

    async def append_on_loop(self, append: Append) -> Appended:
        """``append_many``, for a stage on an event loop: the appends of every job of the loop
        made in one iteration of it share one pipeline. Shielded: a turn the model produced must
        reach the journal before its stage gives up, or a resume would generate it again."""
        batched = loop_local((self, "append"), lambda: Batched(self.append_many, shielded=True))
        return await batched(append)

    def truncate(self, job_id: str, attempt: int, keep: int) -> bool:
        """Keep the first ``keep`` events (False: another attempt owns the journal)."""
        return bool(self._truncate(keys=self._keys(job_id), args=[attempt, keep]))
