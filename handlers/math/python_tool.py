"""The math agent's python tool: code runs in the sandbox's persistent IPython kernel."""
from __future__ import annotations

from typing import Any

from handlers.tools import ToolCall, ToolCallError, function_tool

PYTHON_TOOL = function_tool(
    "python", "Run Python code in a persistent IPython session (state is kept between calls). "
    "Returns what it prints, the value of its last expression, and any error.",
    {"code": {"type": "string", "description": "the code to run"}}, ["code"])
MAX_OBSERVATION_CHARS = 4000


def wants_python(instance: dict[str, Any]) -> bool:
    return "python" in (instance.get("tools") or [])


async def execute(sandbox: Any, call: ToolCall | ToolCallError, timeout_s: float) -> str:
    """The observation for one tool call (errors included, never raised to the agent loop)."""
    if isinstance(call, ToolCallError):
        return f"Error: {call.message}"
    if call.name != "python":
        return f"Error: unknown tool {call.name!r}; the only tool is 'python'"
    code = call.arguments.get("code")
    if not isinstance(code, str):
        return "Error: the python tool needs a string argument 'code'"
    result = await sandbox.ipython(code, timeout_s=timeout_s)
    parts = [result.stdout.rstrip(), result.stderr.rstrip()]
    if result.result is not None:
        parts.append(f"Out: {result.result}")
    if result.error:
        parts.append(result.traceback or result.error)
    if result.timed_out:
        parts.append(f"(interrupted after {timeout_s:g} s)")
    text = "\n".join(p for p in parts if p) or "(no output)"
    if len(text) > MAX_OBSERVATION_CHARS:
        text = text[:MAX_OBSERVATION_CHARS] + f"\n... ({len(text) - MAX_OBSERVATION_CHARS} characters cut)"
    return text
