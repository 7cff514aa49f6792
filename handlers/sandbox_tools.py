"""The agent-facing tools, each a thin adapter from a model's tool call to the sandbox's tool server.

``PYTHON``, ``BASH``, ``EDITOR`` and ``SEARCH`` are :class:`handlers.agent.Tool` values; a
handler picks the ones its agents may use. Observations are plain text written for the model:
what it printed, the exit code, the error, never a Python repr of a result object.
"""
from __future__ import annotations

from typing import Any

from handlers.agent import Tool, ToolArgumentError, string_argument
from singularity.requirements import BASH as BASH_PROGRAM
from singularity.requirements import BM25S, IPYKERNEL, PTYPROCESS, TOOL_SERVER


async def _python(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
    code = string_argument(arguments, "code")
    result = await sandbox.ipython(code, timeout_s=timeout_s)
    parts = [result.stdout.rstrip(), result.stderr.rstrip()]
    if result.result is not None:
        parts.append(f"Out: {result.result}")
    if result.error:
        parts.append(result.traceback or result.error)
    if result.timed_out:
        parts.append(f"(interrupted after {timeout_s:g} s)")
    return "\n".join(p for p in parts if p) or "(no output)"


async def _bash(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
    command = string_argument(arguments, "command")
    result = await sandbox.bash(command, timeout_s=timeout_s)
    lines = [result.output.rstrip()] if result.output.strip() else []
    if result.timed_out:
        lines.append(f"(the command was interrupted after {timeout_s:g} s; the shell is still usable)")
    elif result.exit_code not in (0, None):
        lines.append(f"(exit code {result.exit_code})")
    if result.shell_restarted:
        lines.append("(the shell had to be restarted: its directory and variables were reset)")
    return "\n".join(lines) or "(no output)"


_EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo")


async def _editor(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
    command = string_argument(arguments, "command")
    if command not in _EDITOR_COMMANDS:
        raise ToolArgumentError(f"'command' must be one of {', '.join(_EDITOR_COMMANDS)}")
    path = string_argument(arguments, "path")
    options: dict[str, Any] = {}
    if command == "create":
        options["file_text"] = string_argument(arguments, "file_text")
        options["overwrite"] = True  # agents rewrite whole files; undo restores the old one
    elif command == "str_replace":
        options["old_str"] = string_argument(arguments, "old_str")
        options["new_str"] = string_argument(arguments, "new_str", required=False) or ""
    elif command == "insert":
        line = arguments.get("insert_line")
        if not isinstance(line, int) or isinstance(line, bool):
            raise ToolArgumentError("argument 'insert_line' must be an integer")
        options["insert_line"] = line
        options["new_str"] = string_argument(arguments, "new_str")
    elif command == "view" and arguments.get("view_range") is not None:
        view_range = arguments["view_range"]
        if not (isinstance(view_range, list) and len(view_range) == 2 and all(isinstance(v, int) for v in view_range)):
            raise ToolArgumentError("argument 'view_range' must be [start, end] line numbers")
        options["view_range"] = tuple(view_range)
    result = await sandbox.editor(command, path, **options)
    return result.output


async def _search(sandbox: Any, arguments: dict[str, Any], timeout_s: float) -> str:
    query = string_argument(arguments, "query")
    if not query.strip():
        raise ToolArgumentError("argument 'query' must not be empty")
    k = arguments.get("k", 3)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 10:
        raise ToolArgumentError("argument 'k' must be an integer from 1 to 10")
    result = await sandbox.search(query, k=k)
    if not result.hits:
        return "No results."
    return "\n\n".join(f"[{i}] {hit.title}\n{hit.text}" for i, hit in enumerate(result.hits, 1))


PYTHON = Tool(
    "python", "Run Python code in a persistent IPython session (state is kept between calls). "
    "Returns what it prints, the value of its last expression, and any error.",
    {"code": {"type": "string", "description": "the code to run"}}, ("code",), _python,
    requires=(*TOOL_SERVER, IPYKERNEL))

BASH = Tool(
    "bash", "Run a command in a persistent bash shell in /workspace (the working directory and "
    "variables are kept between calls). Returns its output and exit code.",
    {"command": {"type": "string", "description": "the command line to run"}}, ("command",), _bash,
    requires=(*TOOL_SERVER, PTYPROCESS, BASH_PROGRAM))

EDITOR = Tool(
    "editor", "View, create and edit files in /workspace. Commands: view (path, optional "
    "view_range [start, end]), create (path, file_text), str_replace (path, old_str that occurs "
    "exactly once, new_str), insert (path, insert_line, new_str: inserted after that line), "
    "undo (path: revert the last edit).",
    {"command": {"type": "string", "enum": list(_EDITOR_COMMANDS)},
     "path": {"type": "string", "description": "a path in /workspace"},
     "file_text": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"},
     "insert_line": {"type": "integer"},
     "view_range": {"type": "array", "items": {"type": "integer"}}},
    ("command", "path"), _editor, requires=TOOL_SERVER)

SEARCH = Tool(
    "search", "Search the reference documents. Returns the best matching passages.",
    {"query": {"type": "string", "description": "what to look for"},
     "k": {"type": "integer", "description": "how many passages (1-10, default 3)"}},
    ("query",), _search, requires=(*TOOL_SERVER, BM25S))
