"""Several training samples from one job's endpoint (DESIGN decision 19): a main agent that
runs a sub-agent (a second conversation, its own system prompt and tools), a small-model call
under another model name, a second sub-agent beside the first, and a rewrite. A real
Unix-socket endpoint on a TokenSession whose backend is the scripted vLLM-protocol server (real
Qwen3 token ids); every sample's ids are checked against what the backend saw (its ``/_log``)."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.agents import tool_call
from tests.support.endpoint import TOOLS, Harness, check_samples, log_of, whole

TASK_TOOL = [{"type": "function", "function": {"name": "task", "description": "run a sub-agent", "parameters": {
    "type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}}]

RULES = [
    {"match": "TITLE-SYS", "scope": "prompt", "replies": ["Fixing the listing"]},
    {"match": "SUB-SYS", "scope": "prompt", "replies": [tool_call("bash", command="ls"), "The sub-agent found a.txt."]},
    {"match": "MAIN-SYS", "scope": "prompt", "replies": [
        "I delegate.\n" + tool_call("task", prompt="list the files"), "Done: a.txt is there."]},
]
MAIN = [{"role": "system", "content": "MAIN-SYS You lead."}, {"role": "user", "content": "Find the files."}]


@pytest.fixture
def backend(scripted_llm_server):
    return scripted_llm_server(RULES)


def test_sub_agents_and_a_small_model_call_are_samples_of_their_own(backend, qwen3_tokenizer):
    async def main():
        async with Harness(backend, qwen3_tokenizer) as h:
            main = list(MAIN)
            first = (await h.chat(main, TASK_TOOL))["choices"][0]["message"]
            [task] = first["tool_calls"]
            title = await h.chat([{"role": "system", "content": "TITLE-SYS Write a title."},
                                  {"role": "user", "content": "Find the files."}], model="policy-small")
            assert title["choices"][0]["message"]["content"] == "Fixing the listing"
            sub = [{"role": "system", "content": "SUB-SYS You list files."},
                   {"role": "user", "content": "list the files"}]
            step = (await h.chat(sub, TOOLS))["choices"][0]["message"]
            sub += [step, {"role": "tool", "tool_call_id": step["tool_calls"][0]["id"], "content": "a.txt\n"}]
            answer = (await h.chat(sub, TOOLS))["choices"][0]["message"]["content"]
            assert answer == "The sub-agent found a.txt."
            # a second sub-agent with the same system prompt: a conversation of its own, not a rewrite
            await h.chat([sub[0], {"role": "user", "content": "list the other files"}], TOOLS)
            main += [first, {"role": "tool", "tool_call_id": task["id"], "content": answer}]
            last = (await h.chat(main, TASK_TOOL))["choices"][0]["message"]
            assert last["content"] == "Done: a.txt is there."
            return h.session.trajectory(), h.endpoint.summary()

    trajectory, summary = asyncio.run(main())
    log = log_of(backend)
    assert [(s["origin"], s["model"], s["num_turns"]) for s in trajectory["samples"]] == [
        ("main", "policy", 2), ("auxiliary", "policy-small", 1), ("subagent", "policy", 2), ("subagent", "policy", 1)]
    assert trajectory["drift_events"] == [] and summary["drift_events"] == []
    check_samples(trajectory, log)
    # the calls of each conversation merged: the main agent's second call extends its first
    assert log[5]["prompt_ids"][:len(log[0]["prompt_ids"]) + len(log[0]["output_ids"])] == \
        log[0]["prompt_ids"] + log[0]["output_ids"]
    # the top level is still the main agent's: v1 readers and old trainers see one sample
    assert trajectory["primary_sample"] == 0 and whole(trajectory) == whole(trajectory["samples"][0])
    assert [s["origin"] for s in summary["samples"]] == ["main", "auxiliary", "subagent", "subagent"]
    assert json.dumps(trajectory["segments"]) == json.dumps(trajectory["samples"])


def test_a_rewrite_after_a_sub_agent_rewrites_the_main_agents_sample(backend, qwen3_tokenizer):
    async def main():
        async with Harness(backend, qwen3_tokenizer) as h:
            main = list(MAIN)
            first = (await h.chat(main, TASK_TOOL))["choices"][0]["message"]
            sub = [{"role": "system", "content": "SUB-SYS You list files."}, {"role": "user", "content": "list"}]
            await h.chat(sub, TOOLS)
            rewritten = [{"role": "system", "content": "MAIN-SYS You lead, briefly."}, main[1], first,
                         {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "a.txt"}]
            await h.chat(rewritten, TASK_TOOL)  # the main agent edited its system prompt
            return h.session.trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    assert [(s["origin"], s["parent"]) for s in trajectory["samples"]] == [
        ("main", None), ("subagent", None), ("rewrite", 0)]
    [event] = trajectory["drift_events"]
    assert event["sample"] == 2 and event["message"] == 0 and "rewritten" in event["reason"] and event["call"] == 3
    assert event["drifted_tokens"] > 0
    check_samples(trajectory, log)
    assert trajectory["primary_sample"] == 2  # the main agent's latest
