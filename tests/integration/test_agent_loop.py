"""The shared agent loop (handlers/agent.py) and agent tools (handlers/sandbox_tools.py) against a
real tool server process; the LLM side is a scripted ChatLLM (token-level behaviour is tested
through the service elsewhere)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from handlers.agent import AgentLoop, Tool, clip
from handlers.base import JobContext
from handlers.sandbox_tools import BASH, EDITOR, PYTHON, SEARCH
from handlers.tool_calls import tool_call
from singularity.toolserver.client import ToolClient
from singularity.toolserver.launch import LocalToolServer
from tests.support.scripted_llm import ScriptedLLM

CORPUS = [{"id": "d1", "title": "Water", "text": "Water boils at 100 degrees Celsius at sea level."},
          {"id": "d2", "title": "Iron", "text": "Iron has the chemical symbol Fe and atomic number 26."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> LocalToolServer:
    tmp = tmp_path_factory.mktemp("agent_loop")
    (tmp / "workspace").mkdir()
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    handle = LocalToolServer.start(tmp / "run" / "tools.sock", tmp / "workspace", search_corpus=corpus,
                                   stderr=open(tmp / "toolserver.log", "ab"))
    yield handle
    assert handle.stop() == 0



def run_loop(server: LocalToolServer, loop: AgentLoop, replies: list[str], *, deadline: float | None = None,
             context_length: int = 100_000) -> tuple[dict[str, Any], ScriptedLLM]:
    llm = ScriptedLLM(replies, context_length=context_length)
    job = JobContext(job_id="j", task="t", instance={}, deadline=deadline)

    async def scenario() -> dict[str, Any]:
        async with ToolClient(server.socket) as job.sandbox:
            return await loop.run(job, llm, [{"role": "user", "content": "go"}])

    return asyncio.run(scenario()), llm


def observations(llm: ScriptedLLM) -> list[str]:
    return [m["content"] for m in llm.messages if m["role"] == "tool"]


def test_tools_run_in_the_sandbox_and_finish_ends_the_run(server) -> None:
    loop = AgentLoop([BASH, EDITOR, PYTHON])
    replies = [tool_call("editor", command="create", path="answer.py", file_text="print(6 * 7)\n"),
               tool_call("bash", command="python3 answer.py; echo done"),
               tool_call("python", code="y = 40 + 2\ny"),
               tool_call("finish", answer="42"),
               "never asked"]
    result, llm = run_loop(server, loop, replies)
    assert result["answer"] == "42" and result["finish_reason"] == "finish"
    assert result["iterations"] == 4 and result["tool_calls"] == 4 and result["tool_errors"] == 0
    seen = observations(llm)
    assert "42\ndone" in seen[1]
    assert "Out: 42" in seen[2]
    assert [entry["name"] for entry in result["tool_log"]] == ["editor", "bash", "python", "finish"]
    assert all(entry["seconds"] >= 0 and entry["error"] is False for entry in result["tool_log"])
    assert llm.replies == ["never asked"]


def test_bad_calls_become_error_observations_and_the_model_recovers(server) -> None:
    loop = AgentLoop([BASH, EDITOR])
    replies = ["<tool_call>\n{not json}\n</tool_call>",
               tool_call("rm_rf", path="/"),
               tool_call("bash", cmd="ls"),
               tool_call("editor", command="str_replace", path="missing.txt", old_str="a", new_str="b"),
               tool_call("editor", command="view", path="../../etc/passwd"),
               tool_call("bash", command="false"),
               tool_call("finish", answer="ok")]
    result, llm = run_loop(server, loop, replies)
    seen = observations(llm)
    assert seen[0].startswith("Error: the tool call is not valid JSON")
    assert "unknown tool 'rm_rf'" in seen[1] and "bash, editor, finish" in seen[1]
    assert "argument 'command' must be a string" in seen[2]
    assert seen[3].startswith("Error:") and "missing.txt" in seen[3]
    assert seen[4].startswith("Error:")
    assert "(exit code 1)" in seen[5]  # a failing command is a result, not a tool error
    assert result["tool_errors"] == 5 and result["tool_calls"] == 7
    assert result["finish_reason"] == "finish" and result["answer"] == "ok"


def test_search_tool_returns_passages(server) -> None:
    result, llm = run_loop(server, AgentLoop([SEARCH]), [tool_call("search", query="boiling point of water"),
                                                        tool_call("finish", answer="100")])
    assert "Water boils at 100 degrees" in observations(llm)[0]
    assert result["answer"] == "100"


def test_a_turn_without_a_call_is_nudged_and_max_iterations_ends_the_run(server) -> None:
    loop = AgentLoop([BASH], max_iterations=3)
    result, llm = run_loop(server, loop, ["thinking", "still thinking", "more", "never asked"])
    assert result["finish_reason"] == "max_iterations" and result["iterations"] == 3
    assert [m["role"] for m in llm.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert llm.messages[-1]["role"] == "assistant"  # no nudge left unanswered at the end


def test_without_a_nudge_a_turn_without_a_call_ends_the_run(server) -> None:
    result, _ = run_loop(server, AgentLoop([BASH], nudge=None), ["I am done."])
    assert result["finish_reason"] == "no_tool_call" and result["answer"] is None


def test_answer_in_text_ends_the_run(server) -> None:
    loop = AgentLoop([PYTHON], finish_tool=False, answer_in_text=lambda text: "7" if "seven" in text else None)
    result, _ = run_loop(server, loop, [tool_call("python", code="3 + 4"), "It is seven."])
    assert result["finish_reason"] == "answer" and result["answer"] == "7" and result["tool_calls"] == 1


def test_context_and_time_limits_end_the_run(server) -> None:
    reply = tool_call("bash", command="echo hi")  # ScriptedLLM counts one token per character
    result, _ = run_loop(server, AgentLoop([BASH]), [reply, "unused"],
                         context_length=len("go") + len(reply) + len("hi") + 60)  # 60 < 64 left after
    assert result["finish_reason"] == "context" and result["iterations"] == 1
    result, _ = run_loop(server, AgentLoop([BASH]), ["unused"], deadline=time.monotonic() - 1)
    assert result["finish_reason"] == "time" and result["iterations"] == 0


def test_tool_time_is_capped_by_the_job_budget(server) -> None:
    started = time.monotonic()
    result, llm = run_loop(server, AgentLoop([BASH], tool_timeout_s=60),
                           [tool_call("bash", command="sleep 30"), "unused"], deadline=time.monotonic() + 2)
    assert time.monotonic() - started < 15
    assert "interrupted" in observations(llm)[0]
    assert result["finish_reason"] == "time"


def test_long_observations_are_clipped_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    clipped = clip(text, 600)
    assert clipped.startswith("HEAD") and clipped.endswith("TAIL") and "characters cut" in clipped
    assert len(clipped) < 700
    assert clip("short", 600) == "short"


def test_a_domain_tool_plugs_in(server) -> None:
    async def shout(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
        result = await sandbox.bash(f"echo {arguments['word']} | tr a-z A-Z", timeout_s=timeout_s)
        return result.output

    tool = Tool("shout", "Shout a word.", {"word": {"type": "string"}}, ("word",), shout)
    loop = AgentLoop([tool])
    assert [schema["function"]["name"] for schema in loop.tool_schemas()] == ["shout", "finish"]
    result, llm = run_loop(server, loop, [tool_call("shout", word="hello"), tool_call("finish", answer="HELLO")])
    assert "HELLO" in observations(llm)[0] and result["tool_errors"] == 0

