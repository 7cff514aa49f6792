"""The tool server: an asyncio server on a Unix socket (optionally TCP) dispatching to the tools.

Threads: the asyncio loop (connections, bash, editor, search; on uvloop when it is installed,
about 25 % less latency per call) runs in the ``toolserver-io`` thread; the main thread runs
IPython cells (see :mod:`.mainthread` for why). Start-up imports only asyncio, msgspec and
the protocol; ptyprocess is loaded when the shell is spawned (just
after the READY line), IPython on the first ``ipython`` call and bm25s on the first ``search``.

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
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import protocol
from .bash import BashSession
from .editor import Editor
from .errors import ToolError
from .ipython import IPythonTool
from .mainthread import STOP_SIGNALS, MainThreadRunner
from .unixpath import usable_path
from .protocol import PingResult, ShutdownResult
from .search import BM25Backend, HTTPSearchBackend, SearchBackend, SearchTool

log = logging.getLogger("singularity.toolserver")
DEFAULT_MAX_OUTPUT = 32 * 1024
STUCK_CELL_GRACE_S = 2.0


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
        self.run_dir = Path(tempfile.mkdtemp(prefix="toolserver-"))
        self.bash = BashSession(
            workspace=config.workspace,
            run_dir=self.run_dir,
            max_output=config.max_output,
            shell=config.shell,
        )
        self.ipython = IPythonTool(runner, config.max_output, ipython_dir=self.run_dir / "ipython")
        self.tools = {
            "ping": self._ping,
            "shutdown": self._shutdown,
            "bash": self.bash.run,
            "ipython": self.ipython,
            "editor": Editor(config.workspace, config.max_output),
            "search": SearchTool(config.search_backend()),
        }
        self.addresses: list[str] = []
        self.exit_code = 0
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stop: asyncio.Event | None = None

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
                self._spawn(self._prestart_shell())
            await self._stop.wait()
        finally:
            await self._close()

    def request_stop(self, exit_code: int = 0) -> None:
        self.exit_code = self.exit_code or exit_code
        if self._stop is not None:
            self._stop.set()

    async def _listen(self) -> None:
        if self.config.socket is not None:
            path = self.config.socket
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
            with usable_path(path) as bindable:
                self._servers.append(await asyncio.start_unix_server(self._serve, path=bindable))
            self.addresses.append(str(path))
        if self.config.tcp is not None:
            server = await asyncio.start_server(self._serve, *self.config.tcp)
            host, port = server.sockets[0].getsockname()[:2]
            self._servers.append(server)
            self.addresses.append(f"tcp:{host}:{port}")

    async def _prestart_shell(self) -> None:
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
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.bash.close()
        log.debug("shell closed")
        if self.config.socket is not None:
            self.config.socket.unlink(missing_ok=True)
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                body = await protocol.read_frame(reader)
                if body is None:
                    break
                self._spawn(self._respond(body, writer))
        except (protocol.FrameError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.info("closing a connection: %s", exc)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _respond(self, body: bytes, writer: asyncio.StreamWriter) -> None:
        response = await self.handle(body)
        if writer.is_closing():
            return
        writer.write(protocol.frame(response))
        try:
            await writer.drain()
        except ConnectionError:
            pass

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

    async def _shutdown(self, args: protocol.ShutdownArgs) -> ShutdownResult:
        asyncio.get_running_loop().call_later(0.01, self.request_stop)
        return ShutdownResult()


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


def _salvage_id(body: bytes) -> int | str | None:
    """The id of a request that failed validation, if it has a usable one."""
    try:
        raw = json.loads(body)
    except ValueError:
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
