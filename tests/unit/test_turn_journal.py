"""The token session's journal cursor (prorl_celery.llm.journal): what a resume takes from the
journal, and what a difference does, strict and lenient. Pure logic: its writes go to a list."""
from __future__ import annotations

import asyncio

import pytest

from prorl_celery.core.errors import JournalFenced, ReplayDiverged
from prorl_celery.llm.journal import TurnJournal, crc
from prorl_celery.state.journal import Append, Appended, decode_event


def journaled() -> list[dict]:
    return [{"k": "start", "n": 3, "crc": crc([1, 2, 3])},
            {"k": "gen", "turn": 1, "ids": [7, 8], "lp": [-0.5, -0.25], "fin": "stop", "rec": {"context_len": 3}},
            {"k": "act", "turn": 1, "name": "python", "args": {"code": "print(1)"}},
            {"k": "obs", "turn": 1, "messages": [{"role": "tool", "content": "1"}], "ids": [9]}]


def replay(events: list[dict], **kw) -> tuple[TurnJournal, list[Append]]:
    written: list[Append] = []

    async def write(append: Append) -> Appended:
        written.append(append)
        return Appended(True, append.index + len(append.events))
    return TurnJournal("j", 2, write, index=len(events), replay=events, replay_own=True, **kw), written


def test_a_resume_takes_journaled_turns_and_writes_only_what_is_new() -> None:
    journal, written = replay(journaled())
    journal.on_start([1, 2, 3])
    assert journal.next_generation()["ids"] == [7, 8]
    journal.on_action("python", {"code": "print(1)"})
    journal.on_observation([{"role": "tool", "content": "1"}], [9])
    assert not journal.replaying and journal.next_generation() is None  # live from here
    journal.on_generation({"context_len": 6}, [5], [-1.0], "stop")
    asyncio.run(journal.flush())
    assert len(written) == 1 and written[0].index == 4  # appended after the journaled events
    assert [decode_event(e)["k"] for e in written[0].events] == ["gen"]
    assert journal.checked == 1 and journal.replayed_turns == 1


@pytest.mark.parametrize("step", ["prompt", "action", "observation"])
def test_a_strict_replay_stops_at_the_first_difference(step: str) -> None:
    journal, _ = replay(journaled())
    with pytest.raises(ReplayDiverged) as raised:
        journal.on_start([1, 2, 4] if step == "prompt" else [1, 2, 3])
        journal.next_generation()
        journal.on_action("python", {"code": "print(2)" if step == "action" else "print(1)"})
        journal.on_observation([{"role": "tool", "content": "2" if step == "observation" else "1"}],
                               [10] if step == "observation" else [9])
    assert journal.diverged is not None and journal.diverged.kind == step
    assert raised.value.turn == (0 if step == "prompt" else 1)


def test_a_lenient_replay_records_differences_and_never_goes_live() -> None:
    journal, _ = replay(journaled(), strict=False, live_after_replay=False)
    journal.on_start([1, 2, 3])
    journal.next_generation()
    journal.on_action("python", {"code": "print(1)"})
    journal.on_observation([{"role": "tool", "content": "2"}], [10])
    assert [(d.kind, d.then, d.now) for d in journal.differences] == [("observation", ["1"], ["2"])]
    with pytest.raises(ReplayDiverged):
        journal.next_generation()  # past the journal: no model is asked in a replay
    assert journal.differences[-1].kind == "turn"


def test_a_fenced_append_stops_the_stage() -> None:
    async def fenced(append: Append) -> Appended:
        return Appended(False, 0, "fenced")
    journal = TurnJournal("j", 1, fenced)
    journal.on_generation({}, [1], [0.0], "stop")
    with pytest.raises(JournalFenced):
        asyncio.run(journal.flush())


def test_a_conversation_s_start_goes_with_its_first_turn() -> None:
    """One append for a one-turn rollout: the start waits for the first model turn, while a
    turn's actions and observations are written before the next turn is asked for."""
    written: list[Append] = []

    async def write(append: Append) -> Appended:
        written.append(append)
        return Appended(True, append.index + len(append.events))
    journal = TurnJournal("j", 1, write)
    journal.on_start([1, 2, 3])
    asyncio.run(journal.flush_before_turn())
    assert written == []  # the start alone: no round trip before the turn
    journal.on_generation({"context_len": 3}, [7, 8], [-0.5, -0.25], "stop")
    asyncio.run(journal.flush())
    assert [[decode_event(e)["k"] for e in a.events] for a in written] == [["start", "gen"]]
    journal.on_action("python", {"code": "print(1)"})
    journal.on_observation([{"role": "tool", "content": "1"}], [9])
    asyncio.run(journal.flush_before_turn())  # the tool's answer is journaled before turn 2
    assert [decode_event(e)["k"] for e in written[-1].events] == ["act", "obs"] and written[-1].index == 2
