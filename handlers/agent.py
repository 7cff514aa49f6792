"""The shared loop of tool-using agents: generate, parse tool calls, run them, observe, repeat.

Every domain handler (math, code, swe, stem) runs its RUN stage through :class:`AgentLoop`
with its own tool set and its own idea of a final answer. The loop owns what they share:

* tool calls parsed from the generated text (Hermes/Qwen ``<tool_call>`` blocks,
  :mod:`handlers.tool_calls`), the tools described to the model through the chat template;
* every call executed through the sandbox's tool server, its observation appended as a
  ``tool`` message (token-in/token-out: only the new tokens are added);
* malformed calls, unknown tools, bad arguments and tool-server errors all become an error
  observation the model can recover from, counted in the outcome, never an exception;
* termination: the ``finish`` tool or the domain's answer pattern, ``max_iterations``, the
  context limit (another turn must fit the model length), or the job's time budget.

The outcome is a JSON-serialisable dict that becomes the job's ``run_result``.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from handlers.base import ChatLLM, JobContext
from handlers.tool_calls import ToolCall, ToolCallError, function_tool, parse_tool_calls
from singularity.requirements import Requirement
from singularity.toolserver.errors import ToolError, ToolServerGone

#: an observation longer than this is cut, with a note saying how much was cut
MAX_OBSERVATION_CHARS = 6000
NO_CALL_NUDGE = ("Your reply contains no tool call. Continue with a tool call, or call the "
                 "`finish` tool when you are done.")


class ToolArgumentError(ValueError):
    """A tool call whose arguments are missing or of the wrong type (an error observation)."""


@dataclass(frozen=True)
class Tool:
    """One tool the agent may call: its schema for the chat template and how to run it.

    ``execute(sandbox, arguments, timeout_s)`` returns the observation text; it raises
    :class:`ToolArgumentError` for bad arguments, and any tool-server error is turned into an
    error observation by the loop. ``requires``: what the sandbox must provide for it
    (:mod:`singularity.requirements`), which the handlers that use it declare.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    required: tuple[str, ...]
    execute: Callable[[Any, dict[str, Any], float], Awaitable[str]]
    requires: tuple[Requirement, ...] = ()

    @property
    def schema(self) -> dict[str, Any]:
        return function_tool(self.name, self.description, self.parameters, list(self.required))


async def _finish(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
    return "Finished."


FINISH_TOOL = Tool(
    "finish", "Call this once, when you are done, with your final answer (or a short summary of "
    "what you changed).", {"answer": {"type": "string", "description": "the final answer"}}, (), _finish)


@overload
def string_argument(arguments: dict[str, Any], name: str, *, required: Literal[True] = True) -> str: ...
@overload
def string_argument(arguments: dict[str, Any], name: str, *, required: bool) -> str | None: ...
def string_argument(arguments: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    """The string argument ``name`` of a tool call, or ToolArgumentError naming it."""
    value = arguments.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ToolArgumentError(f"argument {name!r} must be a string")
    return value


def clip(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """``text`` cut to ``limit`` characters, keeping its head and tail (errors sit at the end)."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
    return f"{head}\n... ({len(text) - len(head) - len(tail)} characters cut) ...\n{tail}"


@dataclass
class AgentOutcome:
    """What RUN returns for a tool-using agent (``as_dict`` is the ``run_result``)."""

    answer: str | None = None
    finish_reason: str = "max_iterations"
    iterations: int = 0
    tool_calls: int = 0
    tool_errors: int = 0  # malformed calls, unknown tools, bad arguments, tool-server errors
    tool_log: list[dict[str, Any]] = field(default_factory=list)  # name, seconds, error per call

    def as_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "finish_reason": self.finish_reason, "iterations": self.iterations,
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "tool_log": self.tool_log}


@dataclass
class AgentLoop:
    """One agent's policy for a run: its tools, its answer pattern and its limits.

    ``answer_in_text`` extracts a final answer from a turn without tool calls (math's
    ``\\boxed{}``); ``nudge`` is the user message sent after a turn with neither a tool call nor
    an answer (None ends the run there with ``finish_reason="no_tool_call"``).
    """

    tools: Sequence[Tool]
    max_iterations: int = 10
    tool_timeout_s: float = 30.0
    min_context_tokens: int = 64
    answer_in_text: Callable[[str], str | None] | None = None
    nudge: str | None = NO_CALL_NUDGE
    finish_tool: bool = True
    observation_chars: int = MAX_OBSERVATION_CHARS

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self._all_tools()]

    async def run(self, job: JobContext, llm: ChatLLM, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Converse until a final answer or a limit; returns the outcome as a dict."""
        schemas = self.tool_schemas()
        llm.start(messages, tools=schemas or None)
        outcome = AgentOutcome()
        tools = {tool.name: tool for tool in self._all_tools()}
        nudge_due = False  # sent before the next turn, so a run never ends on an unanswered nudge
        while True:
            stop = self._stop_reason(job, llm, outcome)
            if stop is not None:
                outcome.finish_reason = stop
                break
            if nudge_due:
                assert self.nudge is not None, "nudge_due is set only when there is a nudge"
                llm.add_message("user", self.nudge)
                nudge_due = False
            generation = await llm.generate()
            outcome.iterations += 1
            calls = parse_tool_calls(generation.text) if tools else []
            if not calls:
                answer = self.answer_in_text(generation.text) if self.answer_in_text else None
                if answer is not None:
                    outcome.answer, outcome.finish_reason = answer, "answer"
                    break
                if self.nudge is None:
                    outcome.finish_reason = "no_tool_call"
                    break
                nudge_due = True
                continue
            finished = False
            for call in calls:
                llm.note_action(call.name if isinstance(call, ToolCall) else None,
                                call.arguments if isinstance(call, ToolCall) else call.message)
                observation = await self._execute(job, tools, call, outcome)
                llm.add_message("tool", observation)
                if isinstance(call, ToolCall) and call.name == FINISH_TOOL.name and self.finish_tool:
                    answer = call.arguments.get("answer")
                    outcome.answer = answer if isinstance(answer, str) else None
                    finished = True
            if finished:
                outcome.finish_reason = "finish"
                break
        return outcome.as_dict()

    def _all_tools(self) -> list[Tool]:
        return [*self.tools, FINISH_TOOL] if self.finish_tool else list(self.tools)

    def _stop_reason(self, job: JobContext, llm: ChatLLM, outcome: AgentOutcome) -> str | None:
        """Why no further turn should start, checked before each one."""
        if outcome.iterations >= self.max_iterations:
            return "max_iterations"
        if llm.context_left < self.min_context_tokens:
            return "context"
        if job.time_left() == 0.0:
            return "time"
        return None

    async def _execute(self, job: JobContext, tools: dict[str, Tool], call: ToolCall | ToolCallError,
                       outcome: AgentOutcome) -> str:
        """The observation for one call; every failure becomes an error observation."""
        started = time.monotonic()
        name = call.name if isinstance(call, ToolCall) else None
        error = True
        if isinstance(call, ToolCallError):
            observation = f"Error: {call.message}"
        elif call.name not in tools:
            observation = f"Error: unknown tool {call.name!r}; the tools are {', '.join(sorted(tools))}"
        else:
            timeout_s = self.tool_timeout_s
            left = job.time_left()
            if left is not None:
                timeout_s = max(1.0, min(timeout_s, left))
            try:
                observation = await tools[call.name].execute(job.sandbox, call.arguments, timeout_s)
                error = False
            except ToolArgumentError as problem:
                observation = f"Error: tool {call.name!r}: {problem}"
            except ToolServerGone:
                raise  # the sandbox is gone: no later call can work, so RUN fails
            except ToolError as problem:  # the tool refused (no match, bad path, ...): the model's to read
                observation = f"Error: {problem.message}"
        outcome.tool_calls += 1
        outcome.tool_errors += error
        outcome.tool_log.append({"name": name, "seconds": round(time.monotonic() - started, 4), "error": error})
        return clip(observation or "(no output)", self.observation_chars)
