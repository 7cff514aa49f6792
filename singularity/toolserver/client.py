"""The asyncio client of the tool server: one persistent connection, typed methods.

    async with ToolClient(socket_path) as tools:
        await tools.ping()
        out = await tools.bash("cd src && ls", timeout_s=10)      # BashResult
        cell = await tools.ipython("x = 2\\nx ** 10")              # IPythonResult
        await tools.editor("str_replace", "a.py", old_str="1", new_str="2")
        hits = await tools.search("bubble sort", k=3)              # SearchResult

Several calls may be in flight at once on the one connection (responses are paired by id).
Errors (see :mod:`.errors`): an error answer raises :class:`ToolError` with the server's
``code``; no answer within the call's timeout plus ``margin_s`` raises :class:`ToolTimeout`;
a server that cannot be reached or drops the connection raises :class:`ToolServerGone`, for the
calls in flight and every later one. A command that hits its own timeout is not an error: the
result says ``timed_out``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from . import protocol
from .errors import ToolError, ToolServerGone, ToolTimeout
from .unixpath import usable_path
from .protocol import (
    BashResult,
    EditorResult,
    IPythonResult,
    PingResult,
    Response,
    SearchResult,
)

DEFAULT_DEADLINE_S = 30.0  # for calls without a timeout of their own (ping, editor, search)


class ToolClient:
    def __init__(
        self,
        socket_path: str | os.PathLike | None = None,
        *,
        tcp: tuple[str, int] | None = None,
        connect_timeout_s: float = 10.0,
        margin_s: float = 15.0,
    ) -> None:
        if (socket_path is None) == (tcp is None):
            raise ValueError("give exactly one of socket_path and tcp")
        self.address = str(socket_path) if socket_path is not None else f"tcp:{tcp[0]}:{tcp[1]}"
        self._socket_path, self._tcp = socket_path, tcp
        self.connect_timeout_s, self.margin_s = connect_timeout_s, margin_s
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._gone: str | None = None  # why the connection ended, once it has
        self._connect_lock = asyncio.Lock()

    # -- connection ------------------------------------------------------------------------------

    async def connect(self) -> ToolClient:
        async with self._connect_lock:
            if self._writer is not None:
                return self
            try:
                if self._tcp is not None:
                    opening = asyncio.open_connection(*self._tcp)
                    self._reader, self._writer = await asyncio.wait_for(opening, self.connect_timeout_s)
                else:
                    with usable_path(self._socket_path) as path:
                        opening = asyncio.open_unix_connection(path)
                        self._reader, self._writer = await asyncio.wait_for(opening, self.connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                raise ToolServerGone(
                    f"cannot connect to the tool server at {self.address}: {exc}"
                ) from exc
            self._reader_task = asyncio.get_running_loop().create_task(self._read_responses())
        return self

    async def close(self) -> None:
        self._fail_all("the client was closed")
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def __aenter__(self) -> ToolClient:
        return await self.connect()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # -- typed tools -----------------------------------------------------------------------------

    async def ping(self) -> PingResult:
        return PingResult.parse(await self.call("ping"))

    async def bash(self, command: str, timeout_s: float = protocol.DEFAULT_TIMEOUT_S) -> BashResult:
        """Run ``command`` in the persistent shell; ``timeout_s`` interrupts it with Ctrl-C."""
        result = await self.call(
            "bash",
            {"command": command, "timeout_s": timeout_s},
            deadline_s=timeout_s + self.margin_s,
        )
        return BashResult.parse(result)

    async def ipython(
        self, code: str, timeout_s: float = protocol.DEFAULT_TIMEOUT_S
    ) -> IPythonResult:
        """Run a cell in the persistent kernel; ``timeout_s`` raises KeyboardInterrupt in it.

        The first call also starts the kernel (about a second), which is not counted in
        ``timeout_s`` but is in the client's deadline, hence the wider margin.
        """
        result = await self.call(
            "ipython",
            {"code": code, "timeout_s": timeout_s},
            deadline_s=timeout_s + self.margin_s + 60.0,
        )
        return IPythonResult.parse(result)

    async def editor(
        self,
        command: str,
        path: str,
        *,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: tuple[int, int] | None = None,
        overwrite: bool | None = None,
    ) -> EditorResult:
        """``command`` is view, create, str_replace, insert or undo (see EditorArgs)."""
        given = {
            "file_text": file_text,
            "old_str": old_str,
            "new_str": new_str,
            "insert_line": insert_line,
            "view_range": view_range,
            "overwrite": overwrite,
        }
        args = {
            "command": command,
            "path": path,
            **{k: v for k, v in given.items() if v is not None},
        }
        return EditorResult.parse(await self.call("editor", args))

    async def search(self, query: str, k: int = 5) -> SearchResult:
        return SearchResult.parse(await self.call("search", {"query": query, "k": k}))

    async def shutdown(self) -> None:
        """Ask the server to exit (it answers first)."""
        await self.call("shutdown")

    # -- the protocol ----------------------------------------------------------------------------

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | protocol.Model | None = None,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> dict[str, Any]:
        """Send one request and return the ``result`` dict, or raise a :class:`ToolError`."""
        if self._writer is None:
            await self.connect()
        if self._gone is not None:
            raise ToolServerGone(self._gone)
        if isinstance(args, protocol.Model):
            args = args.to_dict()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._writer.write(
                protocol.encode({"id": request_id, "tool": tool, "args": args or {}})
            )
            await self._writer.drain()
            response: Response = await asyncio.wait_for(future, deadline_s)
        except ToolError:
            raise
        except TimeoutError:
            raise ToolTimeout(
                f"no answer to {tool} within {deadline_s:.1f} s from {self.address}"
            ) from None
        except (ConnectionError, OSError) as exc:
            raise ToolServerGone(f"lost the tool server at {self.address}: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)
        if not response.ok:
            raise ToolError.from_payload(response.error.code, response.error.message)
        return response.result

    async def _read_responses(self) -> None:
        reason = "the tool server closed the connection"
        try:
            while (body := await protocol.read_frame(self._reader)) is not None:
                response = protocol.parse_response(body)
                future = self._pending.get(response.id)
                if future is not None and not future.done():
                    future.set_result(response)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            reason = f"the tool server connection broke: {exc!r}"
        except (ValueError, protocol.FrameError) as exc:
            reason = f"the tool server sent an unreadable frame: {exc}"
        self._fail_all(f"{reason} ({self.address})")

    def _fail_all(self, reason: str) -> None:
        self._gone = self._gone or reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ToolServerGone(self._gone))
        self._pending.clear()
