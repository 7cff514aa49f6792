"""The ProRL Agent Server v1 fields of a result (DESIGN decision 11: one wire, two dialects).

Trainers written against v1 (NeMo-RL's ProRL environments, NeMo-Gym's ``prorl_agent``) read
these beside our own fields; each is defined the way v1 defines it:

``messages[*]``   ``role``, ``content`` and ``token_ids``: the concatenation of every message's
                  ``token_ids`` is exactly ``prompt_ids + response_ids``. An assistant message's
                  ids are the ids the model generated in that turn (its end-of-turn token
                  included) with ``logprobs`` one per id; every other message holds its own
                  template tokens, the generation prompt that follows it, and the template
                  tokens that close a cut-off model turn before it. Assistant messages carry
                  ``tool_calls`` (``{"id", "name", "arguments"}``, as v1 flattens them) and
                  ``input_ids`` (the ids the backend received for that turn), tool messages the
                  ``tool_call_id`` they answer; as in v1, ``input_ids`` and ``logprobs`` are
                  null on the other messages.
``score``         the reward (``reward``)
``resolved``      the job completed and its reward is above 0.99 (v1: tests pass, or the
                  grader's score > 0.99)
``success``       the job completed: every stage ran without error
``filter``        the trainer should drop this trajectory: its reward is not valid (``reward_valid``
                  is false: a failure outside the policy, a timeout or a cancel); ``score`` is
                  then 0.0, which is no judgement
``finish``        the agent ended the episode itself (the ``finish`` tool or a final answer),
                  not a turn, context or time limit
``end_properly``  the last model turn ended with the end-of-turn token and its tool calls parse
``tools``         the tool schemas the model was shown
``timing``        v1's ``init_time``, ``run_time``, ``eval_time``, ``others_time`` (time spent
                  waiting in queues), ``counted_elapsed`` (time that counts against the budget)
                  and ``timeout_triggered``, beside our own keys
"""
from __future__ import annotations

import json
from typing import Any

from handlers.tool_calls import ToolCall, ToolCallError, parse_tool_calls

#: the agent ended the run itself (handlers.agent.AgentOutcome.finish_reason)
SELF_FINISHED = frozenset({"finish", "answer"})


def v1_fields(*, status: str, reward: float, reward_valid: bool, trajectory: dict[str, Any] | None,
              run_result: dict[str, Any], timing: dict[str, float]) -> dict[str, Any]:
    trajectory = trajectory or {}
    messages = v1_messages(trajectory)
    success = status == "completed"
    return {
        "messages": messages,
        "score": reward,
        "resolved": success and reward > 0.99,
        "success": success,
        "finish": run_result.get("finish_reason") in SELF_FINISHED,
        "end_properly": _ended_properly(trajectory),
        "filter": not reward_valid,
        "tools": trajectory.get("tools") or [],
        "timing": {**timing, "init_time": timing["init_s"], "run_time": timing["run_s"],
                   "eval_time": timing["eval_s"], "others_time": timing["queued_s"],
                   "counted_elapsed": timing["active_s"], "timeout_triggered": status == "timeout"},
    }


def v1_messages(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The readable messages with their token ids (and logprobs, tool calls, tool call ids)."""
    messages = trajectory.get("messages") or []
    spans = trajectory.get("message_spans")
    if not spans or len(spans) != len(messages):  # a trajectory recorded before spans existed
        return [dict(message) for message in messages]
    prompt_ids = trajectory.get("prompt_ids") or []
    ids = prompt_ids + (trajectory.get("response_ids") or [])
    logprobs = trajectory.get("response_logprobs") or []
    offset = len(prompt_ids)
    out, pending_calls = [], []
    for index, (message, (start, end)) in enumerate(zip(messages, spans)):
        item = {**message, "token_ids": ids[start:end], "input_ids": None, "logprobs": None}
        if message.get("role") == "assistant":
            item["input_ids"] = ids[:start]  # the context of that call (NeMo-Gym's prompt_token_ids)
            item["logprobs"] = logprobs[start - offset:end - offset]
            calls = _tool_calls(message.get("content") or "", index)
            if calls:
                item["tool_calls"] = calls
            pending_calls = [call["id"] for call in calls]
        elif message.get("role") == "tool" and pending_calls:
            item.setdefault("tool_call_id", pending_calls.pop(0))
        out.append(item)
    return out


def _tool_calls(text: str, index: int) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for number, call in enumerate(parse_tool_calls(text)):
        if isinstance(call, ToolCall):
            calls.append({"id": f"call_{index}_{number}", "name": call.name,
                          "arguments": json.dumps(call.arguments, ensure_ascii=False)})
        else:  # a malformed call still answered by an error observation
            calls.append({"id": f"call_{index}_{number}", "name": None, "arguments": None, "error": call.message})
    return calls


def _ended_properly(trajectory: dict[str, Any]) -> bool:
    turns = trajectory.get("turns") or []
    if not turns or turns[-1].get("finish_reason") != "stop":
        return False
    last = next((m for m in reversed(trajectory.get("messages") or []) if m.get("role") == "assistant"), None)
    if last is None:
        return False
    return not any(isinstance(call, ToolCallError) for call in parse_tool_calls(last.get("content") or ""))
