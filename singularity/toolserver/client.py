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
from typing import Any, cast

from . import protocol
from .errors import ToolError, ToolServerGone, ToolTimeout
from .protocol import (
    BashResult,
    EditorResult,
    IPythonResult,
    PingResult,
    Response,
    SearchResult,
    WarmResult,
)
from .unixpath import usable_path

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
        self.address = str(socket_path) if tcp is None else f"tcp:{tcp[0]}:{tcp[1]}"
        self._socket_path, self._tcp = socket_path, tcp
        self.connect_timeout_s, self.margin_s = connect_timeout_s, margin_s
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._frames = protocol.FrameReader()
        self._transport: asyncio.Transport | None = None
        self._write_paused: asyncio.Future | None = None  # set while the socket buffer is full
        self._gone: str | None = None  # why the connection ended, once it has
        self._connect_lock = asyncio.Lock()

    # -- connection ------------------------------------------------------------------------------

    async def connect(self) -> ToolClient:
        async with self._connect_lock:
            if self._transport is not None:
                return self
            loop = asyncio.get_running_loop()
            try:
                if self._tcp is not None:
                    opening = loop.create_connection(self._protocol, *self._tcp)
                    await asyncio.wait_for(opening, self.connect_timeout_s)
                else:
                    assert self._socket_path is not None  # __init__: one of the two
                    with usable_path(self._socket_path) as path:
                        opening = loop.create_unix_connection(self._protocol, path)
                        await asyncio.wait_for(opening, self.connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                raise ToolServerGone(
                    f"cannot connect to the tool server at {self.address}: {exc}"
                ) from exc
        return self

    def _protocol(self) -> _ClientProtocol:
        return _ClientProtocol(self)

    async def close(self) -> None:
        self._fail_all("the client was closed")
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
            await asyncio.sleep(0)  # let the transport run connection_lost

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

    async def warm(self, ipython: bool = False, search: bool = False) -> WarmResult:
        """Start the shell, and the kernel and the search index when asked, before a job needs
        them (a warm pool's sandbox); runs no user code."""
        result = await self.call("warm", {"ipython": ipython, "search": search},
                                 deadline_s=DEFAULT_DEADLINE_S + 120.0)
        return WarmResult.parse(result)

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
        if self._transport is None:
            await self.connect()
        if self._gone is not None:
            raise ToolServerGone(self._gone)
        if isinstance(args, protocol.Model):
            args = args.to_dict()
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future = self._pending[request_id] = loop.create_future()
        # a timer, not asyncio.wait_for: its bookkeeping was a measurable share of a bash call
        timer = loop.call_later(deadline_s, _expire, future)
        assert self._transport is not None  # connect() made it, and it stays once made
        try:
            self._transport.write(
                protocol.encode({"id": request_id, "tool": tool, "args": args or {}})
            )
            if self._write_paused is not None:
                await asyncio.shield(self._write_paused)
            response: Response = await future
        except TimeoutError:
            raise ToolTimeout(
                f"no answer to {tool} within {deadline_s:.1f} s from {self.address}"
            ) from None
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)
        if not response.ok:
            assert response.error is not None  # Response checks: an error exactly when not ok
            raise ToolError.from_payload(response.error.code, response.error.message)
        assert response.result is not None  # the server's ok_body always carries one
        return response.result

    def _on_frames(self, data: bytes) -> None:
        try:
            bodies = self._frames.feed(data)
            for body in bodies:
                response = protocol.parse_response(body)
                # ids are ours (ints): any other id matches no request
                future = self._pending.get(response.id) if isinstance(response.id, int) else None
                if future is not None and not future.done():
                    future.set_result(response)
        except (ValueError, protocol.FrameError) as exc:
            self._fail_all(f"the tool server sent an unreadable frame: {exc} ({self.address})")
            assert self._transport is not None  # frames arrive only after connection_made
            self._transport.close()

    def _fail_all(self, reason: str) -> None:
        self._gone = self._gone or reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ToolServerGone(self._gone))
        self._pending.clear()
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)


class _ClientProtocol(asyncio.Protocol):
    """Responses are matched to their futures right in ``data_received``: no reader task, so
    an answer wakes the caller directly."""

    def __init__(self, client: ToolClient) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client._transport = cast(asyncio.Transport, transport)  # a stream connection's are

    def data_received(self, data: bytes) -> None:
        self.client._on_frames(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            reason = "the tool server closed the connection"
        else:
            reason = f"the tool server connection broke: {exc!r}"
        self.client._fail_all(f"{reason} ({self.client.address})")

    def pause_writing(self) -> None:
        self.client._write_paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        paused, self.client._write_paused = self.client._write_paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
