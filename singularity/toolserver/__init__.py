"""The tool server: one process per sandbox that executes an agent's actions.

It listens on a Unix socket in a directory bound into the sandbox and speaks a small typed
protocol (:mod:`.protocol`: length-prefixed JSON frames, msgspec structs). Tools: ``bash`` (a
persistent shell on a pty), ``ipython`` (an in-process IPython kernel), ``editor`` (file edits
confined to the workspace), ``search`` (BM25 over a local collection, or an HTTP service), plus
``ping`` and ``shutdown``.

    python -m singularity.toolserver --socket /run/ts/tools.sock --workspace /workspace

    async with ToolClient("/run/ts/tools.sock") as tools:
        result = await tools.bash("ls -la", timeout_s=10)

Nothing heavy is imported here: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "ToolClient",
    "ToolError",
    "ToolTimeout",
    "ToolServerGone",
    "SearchBackend",
    "BM25Backend",
    "HTTPSearchBackend",
    "ServerConfig",
]

_WHERE = {
    "ToolClient": ".client",
    "ToolError": ".errors",
    "ToolTimeout": ".errors",
    "ToolServerGone": ".errors",
    "SearchBackend": ".search",
    "BM25Backend": ".search",
    "HTTPSearchBackend": ".search",
    "ServerConfig": ".server",
}

if TYPE_CHECKING:
    from .client import ToolClient
    from .errors import ToolError, ToolServerGone, ToolTimeout
    from .search import BM25Backend, HTTPSearchBackend, SearchBackend
    from .server import ServerConfig


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_WHERE[name], __name__), name)
