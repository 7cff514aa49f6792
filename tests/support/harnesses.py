"""Scripted replies that drive the real npm harnesses (Claude Code, Codex, OpenCode) through
``prorl-swe__romanum-14``: each reply is in the Qwen3 template's tool-call format, which the
job's endpoint parses into the harness's own tool calls (Anthropic ``tool_use``, Responses
``function_call``, chat ``tool_calls``). Rules are matched on the whole prompt, first match wins:
each harness's system prompt names it."""
from __future__ import annotations

import os

import pytest

from handlers.agent_program.harnesses import HARNESSES
from tests.support.agents import tool_call

#: the gold fix of romanum-14, as one shell command run in the repository
FIX = "sed -i 's/^    (1000, \"M\"),$/    (1000, \"M\"),\\n    (900, \"CM\"),/' romanum/numerals.py"
PROBLEM = "nine hundreds as DCD"
#: a task that asks Claude Code to delegate, and the brief its main agent gives the sub-agent
DELEGATE = "DELEGATE-TO-AGENT: have a general-purpose agent make the fix.\n\n"
BRIEF = "SUBTASK-900: add the (900, \"CM\") entry to romanum/numerals.py"
DONE = "Added (900, \"CM\") to the numeral table: to_roman(1994) is MCMXCIV."

HARNESS_RULES = [
    # small models' calls: OpenCode's titles
    {"match": "You are a title generator", "scope": "prompt", "replies": ["Roman numeral 900 fix"]},
    # Claude Code whose main agent delegates to a sub-agent (its own conversation), then reports
    {"match": "DELEGATE-TO-AGENT", "scope": "prompt", "replies": [
        "I hand the fix to an agent.\n" + tool_call("Agent", description="Fix the 900 entry", prompt=BRIEF,
                                                   subagent_type="general-purpose", run_in_background=False),
        "The agent made the fix: " + DONE]},
    {"match": "SUBTASK-900", "scope": "prompt", "replies": [
        tool_call("Bash", command=FIX, description="Add the 900 entry"), DONE]},
    {"match": f"(?s)Claude Agent SDK.*{PROBLEM}", "scope": "prompt", "replies": [
        "The table lacks 900.\n" + tool_call("Bash", command=FIX, description="Add the 900 entry"), DONE]},
    {"match": f"(?s)Codex CLI.*{PROBLEM}", "scope": "prompt", "replies": [
        "The table lacks 900.\n" + tool_call("exec_command", cmd=FIX), DONE]},
    {"match": f"(?s)You are opencode.*{PROBLEM}", "scope": "prompt", "replies": [
        "The table lacks 900.\n" + tool_call("bash", command=FIX, description="Add the 900 entry"), DONE]},
]


def require_harness(name: str) -> None:
    """Skip a test whose harness is not installed, but fail under CI (``CI`` or
    ``PRORL_REQUIRE_HARNESSES`` set): there ``.ci/run`` installs them."""
    harness = HARNESSES[name]
    if (harness.host_dir() / harness.executable).exists():
        return
    message = (f"{harness.title} is not installed under {harness.host_dir()}: run scripts/install_harnesses.sh")
    if os.environ.get("CI") or os.environ.get("PRORL_REQUIRE_HARNESSES"):
        pytest.fail(message)
    pytest.skip(message)
