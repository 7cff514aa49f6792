"""The tool server's one error tree; every error carries a stable ``code``.

    ToolError                               code given by the server (see below)
    ├── ToolTimeout(TimeoutError)           timeout      (no answer within the client's deadline)
    └── ToolServerGone(ConnectionError)     server_gone  (cannot connect, or the connection dropped)

Codes a server sends in ``{"error": {"code", "message"}}`` (all raised as :class:`ToolError`,
except ``timeout`` which is raised as :class:`ToolTimeout`):

    bad_request             the frame is not a valid request envelope or the args fail validation
    unknown_tool            no tool of that name
    path_outside_workspace  an editor path resolves outside the workspace (``..``, symlink, ...)
    file_not_found          the editor path does not exist
    file_exists             ``create`` on an existing file without ``overwrite``
    is_directory            an edit aimed at a directory
    no_match                ``str_replace``: the old string occurs 0 times
    multiple_matches        ``str_replace``: the old string occurs more than once (count in message)
    invalid_range           a view range or insert line outside the file
    nothing_to_undo         ``undo`` with no recorded edit of that file
    kernel_busy             the kernel still runs an earlier cell that ignored the interrupt
    search_unavailable      no search backend configured
    search_failed           the search backend failed (HTTP error, bad answer)
    os_error                the operating system refused (permission denied, disk full, ...)
    shutting_down           the server is stopping
    internal                an unexpected error inside the server (details in its log)

The tool results themselves say when a command timed out (``timed_out``): a command that ran
past its timeout is an ordinary result, not an error.
"""

from __future__ import annotations


class ToolError(Exception):
    """Base of every tool server error; ``code`` is stable and machine-readable."""

    code = "error"
    request_id: int | str | None = None  # set by the server on errors about one request

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    @classmethod
    def from_payload(cls, code: str, message: str) -> ToolError:
        """The exception for an ``{"code", "message"}`` error sent by the server."""
        if code == ToolTimeout.code:
            return ToolTimeout(message)
        if code == ToolServerGone.code:
            return ToolServerGone(message)
        return ToolError(message, code)


class ToolTimeout(ToolError, TimeoutError):
    """No answer within the deadline (the call's timeout plus the client's margin)."""

    code = "timeout"


class ToolServerGone(ToolError, ConnectionError):
    """The tool server cannot be reached or closed the connection (it died or was stopped)."""

    code = "server_gone"
