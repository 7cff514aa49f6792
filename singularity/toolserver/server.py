"""The tool server: an asyncio server on a Unix socket (optionally TCP) dispatching to the tools.

Threads: the asyncio loop (connections, bash, editor, search; on uvloop when it is installed,
about 25 % less latency per call) runs in the ``toolserver-io`` thread; the main thread runs
IPython cells (see :mod:`.mainthread` for why). Start-up imports only asyncio, msgspec and
the protocol; ptyprocess is loaded when the shell is spawned (after the first answer, or 50 ms
after READY), IPython on the first ``ipython`` call and bm25s on the first ``search``.
Connections are ``asyncio.Protocol`` callbacks, not streams: a stream reader costs a task
wake-up per frame, a measurable share of a bash call that takes a fifth of a millisecond.

Life cycle: bind and listen, print one line ``READY <socket>`` (``READY <socket> tcp:HOST:PORT``
with ``--tcp``, ``READY tcp:HOST:PORT`` with TCP alone) on stdout and flush it, then point file
descriptor 1 at stderr so stray output of user code cannot fill a pipe nobody reads. Stop on
SIGTERM, SIGHUP, an unrequested SIGINT, or the ``shutdown`` tool: close the listeners and
connections, kill the shell's whole session (SIGKILL to its process group and every process of
its session, found through /proc), shut the kernel down, remove the socket and exit 0.

Requests on one connection run concurrently (each in its own task) and answer in any order;
bash commands run one at a time on the one shell, IPython cells one at a time on the kernel.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import msgspec

from . import protocol
from .bash import BashSession
from .editor import Editor
from .errors import ToolError
from .ipython import IPythonTool
from .mainthread import STOP_SIGNALS, MainThreadRunner
from .protocol import PingResult, ShutdownResult, WarmResult
from .search import BM25Backend, HTTPSearchBackend, SearchBackend, SearchTool
from .unixpath import usable_path

log = logging.getLogger("singularity.toolserver")
DEFAULT_MAX_OUTPUT = 32 * 1024
STUCK_CELL_GRACE_S = 2.0
SHELL_PRESTART_DELAY_S = 0.05


@dataclass
class ServerConfig:
    workspace: Path
    socket: Path | None = None
    tcp: tuple[str, int] | None = None
    search_corpus: Path | None = None
    search_url: str | None = None
    max_output: int = DEFAULT_MAX_OUTPUT
    shell: str = "/bin/bash"
    prestart_shell: bool = True

    def search_backend(self) -> SearchBackend | None:
        if self.search_url:
            return HTTPSearchBackend(self.search_url)
        if self.search_corpus:
            return BM25Backend(self.search_corpus)
        return None


class ToolServer:
    def __init__(self, config: ServerConfig, runner: MainThreadRunner) -> None:
        self.config, self.runner = config, runner
        self.started_at = time.monotonic()
        self.run_dir = _private_dir("toolserver-")
        self.bash = BashSession(
            workspace=config.workspace,
            run_dir=self.run_dir,
            max_output=config.max_output,
            shell=config.shell,
        )
        self.ipython = IPythonTool(runner, config.max_output, ipython_dir=self.run_dir / "ipython")
        self.search = SearchTool(config.search_backend())
        self.tools = {
            "ping": self._ping,
            "warm": self._warm,
            "shutdown": self._shutdown,
            "bash": self.bash.run,
            "ipython": self.ipython,
            "editor": Editor(config.workspace, config.max_output),
            "search": self.search,
        }
        self.addresses: list[str] = []
        self.exit_code = 0
        self._servers: list[asyncio.AbstractServer] = []
        self.connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stop: asyncio.Event | None = None
        self._shell_prestarted = False

    # -- life cycle ------------------------------------------------------------------------------

    def run_in_thread(self) -> None:
        """Body of the I/O thread: serve until stopped, then release the main thread."""
        try:
            _run_loop(self._main())
        except BaseException:  # noqa: BLE001 - the main thread must be released in any case
            log.exception("tool server failed")
            self.exit_code = self.exit_code or 1
        finally:
            self.runner.stop()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.runner.on_external_interrupt = lambda: loop.call_soon_threadsafe(self.request_stop)
        loop.add_reader(self.runner.wakeup_reader.fileno(), self._on_signal_bytes)
        try:
            await self._listen()
            announce(self.addresses)
            if self.config.prestart_shell:
                loop.call_later(SHELL_PRESTART_DELAY_S, self._prestart_shell)
            await self._stop.wait()
        finally:
            await self._close()

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        if self._stop is not None:
            self._stop.set()

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.socket is not None:
            path = self.config.socket
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
            with usable_path(path) as bindable:
                self._servers.append(await loop.create_unix_server(self._connection, bindable))
            self.addresses.append(str(path))
        if self.config.tcp is not None:
            server = await loop.create_server(self._connection, *self.config.tcp)
            host, port = server.sockets[0].getsockname()[:2]
            self._servers.append(server)
            self.addresses.append(f"tcp:{host}:{port}")

    def _prestart_shell(self) -> None:
        """Start the shell before the first bash call needs it: after the first answer (the
        runtime's readiness ping) or :data:`SHELL_PRESTART_DELAY_S`, whichever comes first, so
        that spawning it (imports, fork, exec: several milliseconds of this loop) never delays
        that answer."""
        if self._shell_prestarted:
            return
        self._shell_prestarted = True
        self._spawn(self._start_shell())

    async def _start_shell(self) -> None:
        try:
            await self.bash.ensure_started()
        except Exception:  # noqa: BLE001 - the first bash call will try again and report it
            log.warning("the shell did not start", exc_info=True)

    def _on_signal_bytes(self) -> None:
        try:
            data = self.runner.wakeup_reader.recv(64)
        except BlockingIOError:
            return
        if any(byte in STOP_SIGNALS for byte in data):
            log.info("stop signal received")
            self.request_stop()

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.bash.close()
        log.debug("shell closed")
        if self.config.socket is not None:
            self.config.socket.unlink(missing_ok=True)
        import shutil  # not at start-up: it imports bz2 and lzma

        shutil.rmtree(self.run_dir, ignore_errors=True)
        await self._release_main_thread()

    async def _release_main_thread(self) -> None:
        """Interrupt a running cell; if it will not stop, exit the process from here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STUCK_CELL_GRACE_S
        while self.runner.busy and loop.time() < deadline:
            self.runner.interrupt_current()
            await asyncio.sleep(0.05)
        if self.runner.busy:
            log.warning("a cell ignores interrupts; exiting without waiting for it")
            sys.stderr.flush()
            os._exit(self.exit_code)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- requests --------------------------------------------------------------------------------

    def _connection(self) -> _Connection:
        return _Connection(self)

    def dispatch(self, body: bytes, connection: _Connection) -> None:
        """Answer one request on its own task (requests on a connection run concurrently)."""
        self._spawn(self._answer(body, connection))

    async def _answer(self, body: bytes, connection: _Connection) -> None:
        connection.send(await self.handle(body))
        if self.config.prestart_shell and not self._shell_prestarted:
            self._prestart_shell()

    async def handle(self, body: bytes) -> bytes:
        """One request body in, one response body (JSON) out; never raises."""
        try:
            request_id, handler, args = self._parse(body)
        except ToolError as exc:
            return protocol.error_body(exc.request_id, exc.code, exc.message)
        try:
            return protocol.ok_body(request_id, await handler(args))
        except ToolError as exc:
            return protocol.error_body(request_id, exc.code, exc.message)
        except OSError as exc:
            return protocol.error_body(request_id, "os_error", str(exc))
        except asyncio.CancelledError:
            return protocol.error_body(request_id, "shutting_down", "the server is stopping")
        except Exception as exc:  # noqa: BLE001 - one bad call must not take the server down
            log.exception("tool call failed")
            return protocol.error_body(request_id, "internal", f"{type(exc).__name__}: {exc}")

    def _parse(self, body: bytes):
        """(id, handler, validated args), or a ToolError carrying ``request_id``."""
        request_id = None
        try:
            request = protocol.parse_request(body)
            request_id = request.id
            handler = self.tools.get(request.tool)
            if handler is None:
                tools = ", ".join(self.tools)
                raise ToolError(f"no tool {request.tool!r}; tools: {tools}", "unknown_tool")
            args = protocol.parse_args(request.tool, request.args)
        except ToolError as exc:
            exc.request_id = request_id
            raise
        except ValueError as exc:  # bad JSON, or a ValidationError
            error = ToolError(str(exc), "bad_request")
            error.request_id = request_id if request_id is not None else _salvage_id(body)
            raise error from exc
        return request.id, handler, args

    async def _ping(self, args: protocol.PingArgs) -> PingResult:
        return PingResult(pid=os.getpid(), uptime_s=time.monotonic() - self.started_at)

    async def _warm(self, args: protocol.WarmArgs) -> WarmResult:
        started = time.monotonic()
        self._shell_prestarted = True
        await self.bash.ensure_started()
        if args.ipython:
            await self.ipython.warm()
        indexed = await self.search.warm() if args.search else False
        return WarmResult(shell=self.bash.alive, ipython=self.ipython.session.started, search=indexed,
                          seconds=time.monotonic() - started)

    async def _shutdown(self, args: protocol.ShutdownArgs) -> ShutdownResult:
        asyncio.get_running_loop().call_later(0.01, self.request_stop)
        return ShutdownResult()


class _Connection(asyncio.Protocol):
    """One client connection: frames in, each request dispatched, responses written back.

    When the client stops reading (the transport's buffer is full) the connection stops reading
    requests too, so a client that never reads cannot make the server buffer without limit.
    """

    def __init__(self, server: ToolServer) -> None:
        self.server = server
        self.frames = protocol.FrameReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream server's are
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.frames.feed(data)
        except protocol.FrameError as exc:
            log.info("closing a connection: %s", exc)
            self.close()
            return
        for body in bodies:
            self.server.dispatch(body, self)

    def send(self, body: bytes) -> None:
        """Write one response (dropped when the client has gone)."""
        transport = self.transport
        assert transport is not None  # requests come only after connection_made
        if transport.is_closing():
            return
        try:
            transport.write(protocol.frame(body))
        except protocol.FrameError as exc:
            request_id = _salvage_id(body)
            transport.write(protocol.frame(protocol.error_body(request_id, "internal", str(exc))))

    def eof_received(self) -> bool:
        if self.frames.partial:
            log.info("closing a connection: it ended inside a frame")
        return False  # close our side too; answers still being computed are dropped

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        assert self.transport is not None  # asyncio calls this only after connection_made
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None  # asyncio calls this only after connection_made
        self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _run_loop(coro) -> None:
    """asyncio.run, on uvloop when it is installed (TOOLSERVER_UVLOOP=0 turns it off)."""
    if os.environ.get("TOOLSERVER_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def _private_dir(prefix: str) -> Path:
    """A new 0700 directory under $TMPDIR (what tempfile.mkdtemp does, without importing
    tempfile and its random/hashlib chain at start-up)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    while True:
        path = Path(base) / f"{prefix}{os.urandom(6).hex()}"
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue


def _salvage_id(body: bytes) -> int | str | None:
    """The id of a request that failed validation, if it has a usable one."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    request_id = raw.get("id") if isinstance(raw, dict) else None
    return request_id if isinstance(request_id, (int, str)) else None


def announce(addresses: list[str]) -> None:
    """The READY line, then fd 1 becomes fd 2 (nobody may be reading stdout any more)."""
    tcp = [a for a in addresses if a.startswith("tcp:")]
    unix = [a for a in addresses if not a.startswith("tcp:")]
    sys.stdout.write("READY " + " ".join(unix + tcp) + "\n")
    sys.stdout.flush()
    os.dup2(2, 1)


def serve(config: ServerConfig) -> int:
    """Run the tool server in this process until it is stopped; the exit status."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # nothing may wait on the server's stdin (input() in a cell, a shell)
    os.close(devnull)
    runner = MainThreadRunner()
    runner.install_signal_handlers()
    config.workspace = config.workspace.resolve()
    os.chdir(config.workspace)  # IPython's and the shell's relative paths start here
    server = ToolServer(config, runner)
    thread = threading.Thread(target=server.run_in_thread, name="toolserver-io", daemon=True)
    thread.start()
    runner.run()
    try:
        server.ipython.session.shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway
        log.exception("kernel shutdown failed")
    thread.join(timeout=10)
    signal.set_wakeup_fd(-1)
    log.debug("stopped")
    return server.exit_code
