"""Tool calls in generated text, in the Hermes/Qwen format the chat templates describe:

    <tool_call>
    {"name": "python", "arguments": {"code": "print(6 * 7)"}}
    </tool_call>

A malformed call becomes a ``ToolCallError`` the agent loop answers with an error observation,
so the model can recover instead of the rollout failing.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    message: str


def tool_call(name: str, **arguments: Any) -> str:
    """One call in the format :func:`parse_tool_calls` reads: what a model's turn says to call
    ``name`` (the scripted agents of the demo, the tests and the benches write their turns so)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>`` block of a model turn, in order (an unclosed last block counts)."""
    calls: list[ToolCall | ToolCallError] = []
    for body in _CALL.findall(text):
        try:
            payload = json.loads(body.strip())
        except json.JSONDecodeError as error:
            calls.append(ToolCallError(f"the tool call is not valid JSON ({error.msg} at {error.pos})"))
            continue
        if isinstance(payload, dict):
            name, arguments = payload.get("name"), payload.get("arguments", {})
        else:
            name, arguments = None, None
        if isinstance(arguments, str):  # some models send the arguments JSON-encoded
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append(ToolCallError('a tool call needs {"name": string, "arguments": object}'))
        else:
            calls.append(ToolCall(name, arguments))
    return calls


def function_tool(name: str, description: str, parameters: dict[str, Any], required: list[str]) -> dict:
    """A tool description in the OpenAI/Hermes shape chat templates render."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": parameters, "required": required}}}
