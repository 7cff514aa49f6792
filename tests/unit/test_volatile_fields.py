"""The fields a harness's own tools make different on every run (handlers.volatile), each
harness's declaration, and the journal's replay check with and without them: a difference there
alone lets a resume go on (and is counted), any other still stops it and says where."""
from __future__ import annotations

import asyncio

import pytest

from handlers.agent_program.handler import AgentProgramHandler
from handlers.agent_program.harnesses import CLAUDE_CODE, CODEX, OPENCODE
from handlers.base import JobContext
from handlers.volatile import VolatileField, normalise
from prorl_celery.core.errors import ReplayDiverged
from prorl_celery.llm.journal import TurnJournal, crc
from prorl_celery.state.journal import Append, Appended, decode_event

#: Codex 0.171.0's exec_command output for one command (``grep -n '"M"' romanum/numerals.py``) in
#: two runs of it (tests/integration/test_harness_resume.py): its unified exec header, a random
#: chunk id and the measured time, then the exit code, the token count and the output
OUTPUT = '9:    (1000, "M"),\n23:_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}\n'
CODEX_RUN_1 = ("Chunk ID: 36e890\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
               "Original token count: 25\nOutput:\n" + OUTPUT)
CODEX_RUN_2 = CODEX_RUN_1.replace("36e890", "8d1232").replace("0.0000", "0.1187")  # a slower run


def test_codex_s_chunk_id_and_wall_time_are_looked_past() -> None:
    assert CODEX_RUN_1 != CODEX_RUN_2
    assert normalise(CODEX_RUN_1, CODEX.volatile) == normalise(CODEX_RUN_2, CODEX.volatile) == (
        "Chunk ID: <codex_chunk_id>\nWall time: <codex_wall_time> seconds\nProcess exited with code 0\n"
        "Original token count: 25\nOutput:\n" + OUTPUT)


@pytest.mark.parametrize("changed", [
    CODEX_RUN_2.replace("(1000", "(900"),  # the command's own output
    CODEX_RUN_2.replace("count: 25", "count: 26"),
    CODEX_RUN_2.replace("code 0", "code 1"),  # its exit code
    CODEX_RUN_2.replace("Chunk ID: 8d1232", "Chunk ID: 8d1232a1"),  # not Codex's six hex digits
    CODEX_RUN_2.replace("0.1187 seconds", "0.1187 minutes"),
    CODEX_RUN_2 + "Wall time: 3.0000 seconds\n",  # a line the program printed (no header of its own)
])
def test_any_other_change_to_codex_s_output_still_differs(changed: str) -> None:
    assert normalise(CODEX_RUN_1, CODEX.volatile) != normalise(changed, CODEX.volatile)


def test_codex_s_fields_only_on_their_own_lines() -> None:
    printed = "Output:\nthe log says Chunk ID: 36e890 and Wall time: 0.0513 seconds\n"
    assert normalise(printed, CODEX.volatile) == printed


@pytest.mark.parametrize("harness", [CLAUDE_CODE, OPENCODE])
def test_claude_code_and_opencode_declare_none(harness) -> None:
    # their tools answer with the command's output or the file's text alone: every character counts
    assert harness.volatile == ()
    assert normalise(CODEX_RUN_1, harness.volatile) == CODEX_RUN_1


def test_the_agent_handler_hands_the_harness_s_declaration_to_run() -> None:
    handler = AgentProgramHandler()

    def request(**instance):
        job = JobContext(job_id="j", task="agent", instance={"data_source": "agent", "task": "fix it", **instance})
        return handler.endpoint_request(job)
    assert request(agent="codex").volatile_fields == CODEX.volatile
    assert request(agent="claude-code").volatile_fields == ()
    assert request(command="python3 agent.py").volatile_fields == ()  # a program of the job's own


# -- the journal's replay check -----------------------------------------------------------------

def journaled(observation: str) -> list[dict]:
    return [{"k": "start", "n": 3, "crc": crc([1, 2, 3])},
            {"k": "gen", "turn": 1, "ids": [7, 8], "lp": [-0.5, -0.25], "fin": "stop", "rec": {"context_len": 3}},
            {"k": "obs", "turn": 1, "messages": [{"role": "tool", "content": observation}], "ids": [9, 10]},
            {"k": "gen", "turn": 2, "ids": [5], "lp": [-1.0], "fin": "stop", "rec": {"context_len": 7}}]


def resume(volatile: tuple[VolatileField, ...], *, own: bool = True) -> tuple[TurnJournal, list[Append]]:
    written: list[Append] = []

    async def write(append: Append) -> Appended:
        written.append(append)
        return Appended(True, append.index + len(append.events))
    events = journaled(CODEX_RUN_1)
    journal = TurnJournal("j", 2, write, index=len(events) if own else 0, replay=events, replay_own=own,
                          volatile=volatile)
    journal.on_start([1, 2, 3])
    assert journal.next_generation()["ids"] == [7, 8]
    return journal, written


def test_an_observation_alike_past_the_declared_fields_goes_on_and_is_counted() -> None:
    journal, _ = resume(CODEX.volatile)
    journal.on_observation([{"role": "tool", "content": CODEX_RUN_2}], [9, 11])  # this run's ids
    assert journal.next_generation()["ids"] == [5]  # the journaled turn after it: not asked again
    assert (journal.checked, journal.normalised, journal.diverged) == (1, 1, None)


def test_a_fork_copies_this_run_s_observation_into_its_journal() -> None:
    journal, written = resume(CODEX.volatile, own=False)
    journal.on_observation([{"role": "tool", "content": CODEX_RUN_2}], [9, 11])
    asyncio.run(journal.flush())
    copied = [e for e in map(decode_event, written[-1].events) if e["k"] == "obs"]
    assert [(e["messages"][0]["content"], e["ids"]) for e in copied] == [(CODEX_RUN_2, [9, 11])]


def test_without_a_declaration_the_same_observation_restarts() -> None:
    journal, _ = resume(())
    with pytest.raises(ReplayDiverged):
        journal.on_observation([{"role": "tool", "content": CODEX_RUN_2}], [9, 11])
    assert journal.diverged is not None and (journal.diverged.turn, journal.diverged.kind) == (1, "observation")
    assert journal.normalised == 0


@pytest.mark.parametrize("content, ids", [
    (CODEX_RUN_2.replace("code 0", "code 1"), [9, 11]),  # a real difference beside the volatile ones
    (CODEX_RUN_1, [9, 11]),  # the same text with other ids: a tokenization difference, never volatile
    (CODEX_RUN_1 + "more", [9, 10]),
])
def test_with_a_declaration_a_real_difference_still_restarts_and_says_where(content: str, ids: list[int]) -> None:
    journal, _ = resume(CODEX.volatile)
    with pytest.raises(ReplayDiverged) as raised:
        journal.on_observation([{"role": "tool", "content": content}], ids)
    assert raised.value.turn == 1 and journal.diverged is not None
    assert journal.diverged.as_dict() == {"turn": 1, "kind": "observation", "then": [CODEX_RUN_1], "now": [content]}
    assert journal.normalised == 0


def test_an_identical_observation_is_not_counted_as_normalised() -> None:
    journal, _ = resume(CODEX.volatile)
    journal.on_observation([{"role": "tool", "content": CODEX_RUN_1}], [9, 10])
    assert (journal.checked, journal.normalised) == (1, 0)
