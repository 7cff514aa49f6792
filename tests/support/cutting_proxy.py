"""A loopback TCP proxy for fault tests: it relays a client's connections to a server and cuts
one of them at a point a rule chooses, to lose replies deterministically (no server restart, no
race with the client).

A rule watches one direction of every connection and says where in it to cut:

- :class:`AfterCommand` (client to server, RESP): after the ``after``-th request named
  ``command``. The server gets exactly the requests up to there and applies them; the client
  gets none of their replies (a lost reply between two commands the test chooses).
- :class:`AfterNdjsonLines` (server to client, HTTP): after the ``lines``-th result line of a
  streamed ``application/x-ndjson`` reply (a stream dropped mid-way).

Only the first cut happens: every other connection, before and after it, passes untouched.
The proxy counts the cut (``cuts``) before it closes the client's socket: a client that saw its
connection cut reads ``cuts == 1``.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Protocol

#: how long a request cut waits for the server to end the connection it half-closed (it does
#: once it has read, and so applied, every request it got)
SETTLE_S = 10.0


@dataclass
class Link:
    """One relayed connection; ``index`` counts connections in the order they were opened."""

    index: int
    client: socket.socket
    upstream: socket.socket
    #: set by a cut: from then on nothing the server sends reaches the client
    muted: threading.Event = field(default_factory=threading.Event)
    #: set once the server's side has ended (its replies read to the end)
    upstream_ended: threading.Event = field(default_factory=threading.Event)


class CutRule(Protocol):
    """Where to cut, in the data of one direction. ``requests``: the rule watches what the
    client sends, else what the server sends."""

    requests: bool

    def cut_at(self, link: Link, data: bytes) -> int | None:
        """The offset in ``data`` (the next bytes of ``link`` in the rule's direction) after
        which to cut it, or None to relay all of it; an offset at most once in the proxy's
        life (one cut). Called for every read of that direction, one call at a time."""


class CuttingProxy:
    """A proxy on a free loopback port (``port``) to ``127.0.0.1:upstream_port`` that cuts the
    first connection ``rule`` picks: a cut in the requests forwards them up to the cut, mutes
    the replies, half-closes the server's side and waits for the server to end it (it has
    applied all it got), then closes both; a cut in the replies relays them up to the cut and
    closes both at once. Use as a context manager or ``close()``."""

    def __init__(self, upstream_port: int, rule: CutRule) -> None:
        self.upstream_port, self.rule = upstream_port, rule
        self.cuts = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._links: list[Link] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, name="cutting-proxy", daemon=True)
        self._accepting.start()

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop listening and close every connection still open."""
        # shutdown wakes the blocked accept(); a bare close() would leave it listening
        _close(self._listener)
        self._accepting.join(5)
        with self._lock:
            links = list(self._links)
        for link in links:
            _close(link.client, link.upstream)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server is gone: so is this connection
                _close(client)
                continue
            with self._lock:
                link = Link(self.connections, client, upstream)
                self.connections += 1
                self._links.append(link)
            threading.Thread(target=self._relay_requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._relay_replies, args=(link,), daemon=True).start()

    def _take_cut(self, link: Link, data: bytes, requests: bool) -> int | None:
        """Where to cut ``data``, if the rule watches this direction and picks this point."""
        if requests != self.rule.requests:
            return None
        with self._lock:  # one rule for every connection: its counts stay consistent
            at = self.rule.cut_at(link, data)
            if at is not None:
                self.cuts += 1
        return at

    def _relay_requests(self, link: Link) -> None:
        while data := _recv(link.client):
            at = self._take_cut(link, data, requests=True)
            if at is not None:
                link.muted.set()  # before forwarding: no reply of the cut requests reaches the client
                _send(link.upstream, data[:at])
                try:
                    link.upstream.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                link.upstream_ended.wait(SETTLE_S)
                break
            if not _send(link.upstream, data):
                break
        _close(link.client, link.upstream)

    def _relay_replies(self, link: Link) -> None:
        while data := _recv(link.upstream):
            if link.muted.is_set():
                continue  # read on to the server's end: the request cut waits for it
            at = self._take_cut(link, data, requests=False)
            if at is not None:
                link.muted.set()
                _send(link.client, data[:at])
                break
            if not _send(link.client, data):
                break
        link.upstream_ended.set()
        if not link.muted.is_set() or not self.rule.requests:
            _close(link.client, link.upstream)


class AfterCommand:
    """Cut a connection's requests right after its ``after``-th RESP command named ``command``
    (e.g. ``b"EVALSHA"``): the first connection to send that many. ``forwarded[i]``: how many
    of them connection ``i`` carried to the server."""

    requests = True

    def __init__(self, command: bytes, after: int) -> None:
        self.command, self.after = command.upper(), after
        self.forwarded: dict[int, int] = {}
        self.cut = False
        self._pending: dict[int, bytes] = {}  # per connection: the start of a request not yet whole

    def cut_at(self, link: Link, data: bytes) -> int | None:
        held = self._pending.get(link.index, b"")
        buffer, end = held + data, 0
        while (parsed := resp_command(buffer, end)) is not None:
            name, end = parsed
            if name != self.command:
                continue
            self.forwarded[link.index] = self.forwarded.get(link.index, 0) + 1
            if not self.cut and self.forwarded[link.index] == self.after:
                self.cut = True  # nothing after it reaches the server: stop counting here
                return end - len(held)
        self._pending[link.index] = buffer[end:]
        return None


class AfterNdjsonLines:
    """Cut the first ``application/x-ndjson`` reply (``POST /jobs/wait``) right after its
    ``lines``-th result line (a line with a ``"job_id"``). ``streams``: how many such replies
    began, over all connections, the cut one and those after it included."""

    requests = False
    CONTENT_TYPE = b"application/x-ndjson"
    RESULT = b'"job_id"'

    def __init__(self, lines: int) -> None:
        self.lines = lines
        self.streams = 0
        self.cut = False
        self._state: dict[int, tuple[bool, int, bytes]] = {}  # per connection: streaming, lines, tail

    def cut_at(self, link: Link, data: bytes) -> int | None:
        streaming, seen, tail = self._state.get(link.index, (False, 0, b""))
        # the tail (the unread end of the last read) finds a marker split across two reads
        buffer, position, at = tail + data, 0, None
        while True:
            header = buffer.find(self.CONTENT_TYPE, position)
            result = buffer.find(self.RESULT, position)
            if header >= 0 and (result < 0 or header < result):
                streaming, seen = True, 0  # a new reply on this (keep-alive) connection
                self.streams += 1
                position = header + len(self.CONTENT_TYPE)
            elif result < 0:
                position = max(position, len(buffer) - max(len(self.CONTENT_TYPE), len(self.RESULT)) + 1)
                break
            elif not streaming or seen + 1 < self.lines or self.cut:
                seen += 1 if streaming else 0
                position = result + len(self.RESULT)
            elif (line_end := buffer.find(b"\n", result)) >= 0:
                self.cut = True
                at = line_end + 1 - len(tail)
                break
            else:
                position = result  # the line ends in a later read: read it again from its start
                break
        self._state[link.index] = (streaming, seen, buffer[position:])
        return at


def resp_command(buffer: bytes, start: int) -> tuple[bytes, int] | None:
    """The name (upper case) of the RESP request at ``start`` and where it ends; None while the
    buffer does not hold all of it yet."""
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return None
    if buffer[start:start + 1] != b"*":
        raise AssertionError(f"not a RESP request: {buffer[start:start + 40]!r}")
    position, name = line_end + 2, b""
    for i in range(int(buffer[start + 1:line_end])):
        header_end = buffer.find(b"\r\n", position)
        if header_end < 0:
            return None
        length = int(buffer[position + 1:header_end])
        data_end = header_end + 2 + length
        if len(buffer) < data_end + 2:
            return None
        if i == 0:
            name = buffer[header_end + 2:data_end].upper()
        position = data_end + 2
    return name, position


def _recv(sock: socket.socket) -> bytes:
    """What the socket has, or b"" once it is closed (by the peer or by a cut)."""
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
