"""The token session's side of the per-turn journal: what each turn records, and replaying it.

The session (``prorl_celery.llm.session.TokenSession``) tells its :class:`TurnJournal` about
every step of the conversation, as an event:

=======  ======================================================================================
kind     fields
=======  ======================================================================================
start    ``n`` prompt length, ``crc`` CRC-32 of the prompt ids (``start``, ``start_ids``)
gen      ``turn`` (1-based), ``ids`` response ids, ``lp`` their logprobs, ``fin`` finish reason,
         ``rec`` the turn's record (prompt length ``context_len``, ``policy_version``, ...)
act      ``turn``, ``name``, ``args``: a tool action the handler carried out after that turn
obs      ``turn``, ``messages`` (role, content, fields), ``ids`` their token ids (mask 0)
seg      ``turn``, ``drift``: a new segment started (the per-job endpoint's history drifted)
=======  ======================================================================================

A model turn is written as soon as the backend returned it (so a crash during its tools never
costs its tokens again); actions and observations are written before the next turn is asked
for, and at the end of RUN (``flush``); the conversation's ``start`` goes with its first turn
(``flush_before_turn``). Appends of many jobs of one RUN loop share a pipeline.

Replaying: a journal built with ``replay=`` events consumes them first. Each step the handler
takes is checked against the next journaled event, and a model turn is taken from the journal
instead of the backend (``next_generation``), so no journaled token is generated twice. A
difference is a :class:`~prorl_celery.core.errors.ReplayDiverged` when ``strict`` (a resume, a
fork: RUN restarts from turn zero) and a recorded :class:`Difference` otherwise (``prorl replay``,
which also never goes live: a turn past the journal is a difference that ends the replay).

An observation is compared text and token ids. The handler may name fields its program's own
tools make different on every run (``volatile``: Codex's chunk id and wall time,
``handlers.volatile``): when the texts differ only there (equal once each field's matches are
replaced by its placeholder), the observation counts as the same (``normalised`` counts them)
and the replay goes on with this run's text and ids in the conversation, so the trajectory holds
exactly what the model is sent now. Equal texts with other ids, or any other difference, still
differ.
"""
from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from handlers.volatile import VolatileField, normalise
from prorl_celery.core.errors import BackendError, JournalFenced, ReplayDiverged
from prorl_celery.llm.backends import Completion
from prorl_celery.state.journal import Append, Appended, encode_event

log = logging.getLogger(__name__)

#: what writes a job's events: an ``Append`` in, the store's answer out
Writer = Callable[[Append], Awaitable[Appended]]

#: most differences one replay keeps in full (the rest are only counted)
MAX_DIFFERENCES = 200


class NoModel:
    """The backend of a replay: every model turn comes from the journal, so it is never asked."""

    address = "journal"  # what the replay's trajectory names as its backend
    protocol = "vllm"

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Completion:
        raise BackendError("a replay asks no model: every turn comes from the journal")

    async def context_length(self) -> int | None:
        return None


def crc(ids: list[int]) -> int:
    return zlib.crc32(b"".join(i.to_bytes(4, "little", signed=True) for i in ids))


@dataclass(frozen=True)
class Difference:
    """Where a replay met something else than the journal holds."""

    turn: int
    kind: str  # prompt | action | observation | extra_observation | missing_observation | turn
    then: Any
    now: Any

    def as_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "kind": self.kind, "then": self.then, "now": self.now}


@dataclass
class TurnJournal:
    """One RUN stage's journal writer and, when it resumes, replays or forks, its replay cursor.

    ``write`` is None for a session that journals nothing (PRORL_JOURNAL=false); ``index`` is
    the own journal's length (its events already there); ``replay_own`` says that the replayed
    events are the job's own journal (a resume: they are there already), else they are copied
    into it as they are replayed (a fork, a replay)."""

    job_id: str
    attempt: int
    write: Writer | None
    index: int = 0
    replay: list[dict[str, Any]] = field(default_factory=list)
    replay_own: bool = False
    strict: bool = True
    live_after_replay: bool = True
    cursor: int = 0
    turn: int = 0  # model turns so far
    differences: list[Difference] = field(default_factory=list)
    different: int = 0  # all of them, kept or not
    checked: int = 0  # observations compared with the journal
    #: fields the program's own tools make different on every run, looked past when comparing
    volatile: tuple[VolatileField, ...] = ()
    normalised: int = 0  # observations equal to the journal's only once ``volatile`` was replaced
    stopped: str | None = None  # why this stage journals no more (full, order)
    #: the difference that ended a strict replay (kept too when a handler swallowed the error:
    #: an agent program's endpoint call that failed)
    diverged: Difference | None = None
    _pending: list[str] = field(default_factory=list)
    #: how many of the pending events are a conversation's ``start`` (see ``flush_before_turn``)
    _pending_starts: int = 0

    # -- state ------------------------------------------------------------------------------

    @property
    def replaying(self) -> bool:
        return self.cursor < len(self.replay)

    @property
    def replayed_turns(self) -> int:
        """Model turns taken from the journal so far."""
        return sum(1 for e in self.replay[:self.cursor] if e["k"] == "gen")

    # -- what the session reports -------------------------------------------------------------

    def on_start(self, prompt_ids: list[int]) -> None:
        event = {"k": "start", "n": len(prompt_ids), "crc": crc(prompt_ids)}
        expected = self._expect("start")
        if expected is not None and (expected["n"], expected["crc"]) != (event["n"], event["crc"]):
            self._differ("prompt", {"n": expected["n"]}, {"n": event["n"]})
        pending = len(self._pending)
        self._record(event, expected)
        self._pending_starts += len(self._pending) - pending

    def next_generation(self) -> dict[str, Any] | None:
        """The journaled model turn to use instead of asking the backend, or None (live)."""
        while self.replaying and self.replay[self.cursor]["k"] != "gen":
            missing = self.replay[self.cursor]
            self._differ("missing_observation" if missing["k"] == "obs" else missing["k"], _brief(missing), None)
            self.cursor += 1  # lenient: skip what this run did not do
        if self.replaying:
            event = self.replay[self.cursor]
            self.cursor += 1
            self.turn += 1
            if not self.replay_own:
                self._pending.append(encode_event(event))
            return event
        if self.replay and not self.live_after_replay:
            self._differ("turn", None, f"the agent asked for turn {self.turn + 1}; the journal has {self.turn}")
            raise ReplayDiverged(f"turn {self.turn + 1} is past the journal", turn=self.turn,
                                 detail={"kind": "turn"})
        return None

    def on_generation(self, record: dict[str, Any], ids: list[int], logprobs: list[float], finish: str) -> None:
        """A live model turn (``next_generation`` gave None)."""
        self.turn += 1
        self._pending.append(encode_event({"k": "gen", "turn": self.turn, "ids": ids, "lp": logprobs,
                                           "fin": finish, "rec": record}))

    def on_action(self, name: str | None, arguments: Any) -> None:
        event = {"k": "act", "turn": self.turn, "name": name, "args": arguments}
        expected = self._expect("act")
        if expected is not None and (expected["name"], expected["args"]) != (name, arguments):
            self._differ("action", {"name": expected["name"], "args": expected["args"]},
                         {"name": name, "args": arguments})
        self._record(event, expected)

    def on_observation(self, messages: list[dict[str, Any]], ids: list[int]) -> None:
        event = {"k": "obs", "turn": self.turn, "messages": messages, "ids": ids}
        if self.replaying and self.replay[self.cursor]["k"] == "gen":
            self._differ("extra_observation", None, _texts(messages))
            self._record(event, None)
            return
        expected = self._expect("obs")
        if expected is not None:
            self.checked += 1
            then, now = _texts(expected["messages"]), _texts(messages)
            if then != now and self._alike(then, now):
                self.normalised += 1  # its ids are this run's: the text the model is sent now
            elif then != now or expected["ids"] != ids:
                self._differ("observation", then, now)
        self._record(event, expected)

    def on_segment(self, drift: dict[str, Any]) -> None:
        event = {"k": "seg", "turn": self.turn, "drift": drift}
        self._record(event, self._expect("seg"))

    @property
    def unreplayed(self) -> int:
        """Journaled events this run never reached (its rollout ended sooner)."""
        return len(self.replay) - self.cursor

    # -- writing ------------------------------------------------------------------------------

    async def flush_before_turn(self) -> None:
        """``flush`` before a model turn is asked for: the last turn's actions and observations
        are journaled first, so a resume checks them. Pending ``start`` events alone wait for the
        turn's own append instead: they hold no token and no tool's answer, and a journal that
        lacks them resumes as one holding only them would (from turn zero). So a rollout's first
        turn costs one append round trip, not two; a later attempt that took the journal over
        meanwhile is found by that append, after the turn, as it is for every later turn."""
        if len(self._pending) > self._pending_starts:
            await self.flush()

    async def flush(self) -> None:
        """Write what is pending, in one append (a no-op when nothing is)."""
        self._pending_starts = 0
        if not self._pending or self.write is None or self.stopped:
            self._pending.clear()
            return
        events, self._pending = self._pending, []
        reply = await self.write(Append(self.job_id, self.attempt, self.index, events))
        if reply.ok:
            self.index = reply.length
            return
        if reply.refused == "fenced":
            raise JournalFenced(f"job {self.job_id}: a later attempt owns the journal; attempt "
                                f"{self.attempt} stops")
        # full (the bounds), or out of order (a bug): the rollout goes on, unjournaled from here
        self.stopped = reply.refused
        log.warning("job %s: journal %s at event %d; the rest of this rollout is not journaled",
                    self.job_id, reply.refused, self.index)

    # -- replay -------------------------------------------------------------------------------

    def _expect(self, kind: str) -> dict[str, Any] | None:
        """The journaled event the next step must match, consumed; None past the journal."""
        if not self.replaying:
            return None
        event = self.replay[self.cursor]
        if event["k"] != kind:
            self._differ(kind if kind != "obs" else "observation", _brief(event), kind)
            return None  # lenient: this step is new, the journal's stays next
        self.cursor += 1
        return event

    def _alike(self, then: list[str], now: list[str]) -> bool:
        """Equal once the declared volatile fields are replaced (never, with none declared)."""
        if not self.volatile or len(then) != len(now):
            return False
        return all(normalise(a, self.volatile) == normalise(b, self.volatile) for a, b in zip(then, now))

    def _record(self, event: dict[str, Any], replayed: dict[str, Any] | None) -> None:
        if replayed is not None and self.replay_own:
            return  # already in the job's own journal
        self._pending.append(encode_event(event))  # as this run had it: a copy, or a new step

    def _differ(self, kind: str, then: Any, now: Any) -> None:
        difference = Difference(self.turn, kind, then, now)
        self.different += 1
        if len(self.differences) < MAX_DIFFERENCES:
            self.differences.append(difference)
        if self.strict:
            self.diverged = difference
            raise ReplayDiverged(f"after turn {self.turn}: the {kind} differs from the journal's",
                                 turn=self.turn, detail=difference.as_dict())


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content", "")) for m in messages]


def _brief(event: dict[str, Any]) -> Any:
    if event["k"] == "obs":
        return _texts(event["messages"])
    if event["k"] == "act":
        return {"name": event["name"], "args": event["args"]}
    return event["k"]
