"""The ``ipython`` tool: a persistent IPython kernel inside the tool server's own process.

The kernel is ipykernel's in-process kernel (``ipykernel.inprocess.InProcessKernelManager``),
with the SQLite history off and an IPython directory private to the server, started lazily on
the first call (importing IPython and starting the kernel takes about a second; the tool
server itself must start in milliseconds). Cells run on the main thread
through :class:`~singularity.toolserver.mainthread.MainThreadRunner`; variables, imports and
functions persist across calls.

What a call returns: ``stdout`` and ``stderr`` written by the cell through ``sys.stdout`` /
``sys.stderr`` (``print``, ``!shell`` commands, warnings), each capped at ``max_output``
characters with a note; ``result``, the ``text/plain`` repr of the cell's value (and of
``display()`` calls, appended to ``stdout``); ``error`` (``"Name: message"``) and ``traceback``
(plain text, no colours) when the cell raised. Output that a cell's subprocesses or C code write
straight to file descriptors 1/2 is not captured (it goes to the server's log).

Timeouts. An in-process kernel cannot be pre-empted safely, so a timeout is an interrupt: after
``timeout_s`` the tool sends SIGINT to the main thread (again every 0.1 s during a grace
period), which raises ``KeyboardInterrupt`` in the cell: ``while True: pass`` and
``time.sleep(100)`` both stop, the result says ``timed_out`` with the ``KeyboardInterrupt``
traceback, and the kernel and its state stay usable. A cell stuck inside C code that never
returns to the interpreter cannot be interrupted: the result then says ``timed_out`` and
``kernel_busy``, and later calls fail with ``kernel_busy`` until that cell ends (the sandbox
should be recycled). The first call's kernel start-up does not count against its timeout.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .errors import ToolError
from .mainthread import MainThreadRunner
from .protocol import IPythonArgs, IPythonResult

if TYPE_CHECKING:  # imported when the first cell runs: the server's start-up stays light
    from ipykernel.inprocess.ipkernel import InProcessKernel
    from ipykernel.inprocess.manager import InProcessKernelManager

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
KERNEL_START_TIMEOUT_S = 120.0
POLL_S = 0.1


class TextCapture(io.TextIOBase):
    """A ``sys.stdout`` stand-in that keeps at most ``limit`` characters."""

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit = name, limit
        self.reset()

    def reset(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self.dropped = 0

    def write(self, text: str) -> int:
        room = self.limit - self._size
        if room > 0:
            self._parts.append(text[:room])
            self._size += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    # read-only as io.TextIOBase's own is; typeshed declares that one a plain attribute
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def text(self) -> str:
        note = (
            f"\n[... {self.dropped} characters dropped (limit {self.limit}) ...]"
            if self.dropped
            else ""
        )
        return "".join(self._parts) + note


class KernelSession:
    """The in-process kernel; every method runs on the main thread.

    Cells go straight to the kernel's shell (``kernel.shell.run_cell``) instead of through the
    in-process message channels: no thread hop per message, no iopub queue to drain, and
    top-level ``await`` works (ipykernel 7's in-process ``execute_request`` path fails on it).
    The shell's display hook and display publisher are pointed at this object, so the result
    repr and ``display()`` output are caught as they are produced.
    """

    def __init__(
        self, runner: MainThreadRunner, max_output: int, ipython_dir: Path | None = None
    ) -> None:
        self.runner, self.ipython_dir = runner, ipython_dir
        self.stdout = TextCapture("stdout", max_output)
        self.stderr = TextCapture("stderr", max_output)
        self._manager: InProcessKernelManager | None = None
        self._kernel: InProcessKernel | None = None
        self._result_text: str | None = None
        self._displays: list[str] = []

    @property
    def started(self) -> bool:
        return self._kernel is not None

    def start(self) -> None:
        if self.started:
            return
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # debugpy's start-up warning
        if self.ipython_dir is not None:  # never the user's ~/.ipython (start-up files, history)
            os.environ.setdefault("IPYTHONDIR", str(self.ipython_dir))
        complete_site()
        from ipykernel.inprocess.manager import InProcessKernelManager
        from traitlets.config import Config

        manager = InProcessKernelManager(config=Config({"HistoryManager": {"enabled": False}}))
        manager.start_kernel()
        kernel = manager.kernel
        assert kernel is not None  # start_kernel() made it
        shell = kernel.shell
        shell.events.register("pre_run_cell", lambda *_: self.runner.set_user_code(True))
        shell.events.register("post_run_cell", lambda *_: self.runner.set_user_code(False))
        shell.run_line_magic("colors", "NoColor")
        shell.displayhook.write_format_data = self._on_result
        shell.display_pub.publish = self._on_display
        self._manager, self._kernel = manager, kernel

    def execute(self, code: str) -> IPythonResult:
        self.start()
        kernel = self._kernel
        assert kernel is not None and kernel.shell is not None  # start() made them
        shell = kernel.shell
        for capture in (self.stdout, self.stderr):
            capture.reset()
        self._result_text, self._displays = None, []
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.stdout, self.stderr
        kernel._forward_input(False)  # input() raises StdinNotImplementedError
        try:
            outcome = shell.run_cell(code, store_history=True)
        except BaseException as exc:  # noqa: BLE001 - an interrupt that escaped the cell (await)
            self.runner.set_user_code(False)
            self._cancel_leftover_tasks()
            return self._result(
                exc, traceback_text=f"{type(exc).__name__} (the cell was interrupted)"
            )
        finally:
            sys.stdout, sys.stderr = saved
            kernel._restore_input()
        error = outcome.error_before_exec or outcome.error_in_exec
        stb = shell._last_traceback if error is not None else None
        return self._result(error, traceback_text=_plain_traceback(stb) if stb else None)

    def _result(self, error: BaseException | None, traceback_text: str | None) -> IPythonResult:
        displays = "".join(text + "\n" for text in self._displays)
        return IPythonResult(
            stdout=self.stdout.text() + displays,
            stderr=self.stderr.text(),
            result=self._result_text,
            error=None if error is None else f"{type(error).__name__}: {error}",
            traceback=traceback_text if error is not None else None,
            truncated=bool(self.stdout.dropped or self.stderr.dropped),
        )

    def _on_result(self, format_dict: dict, md_dict: dict | None = None) -> None:
        self._result_text = format_dict.get("text/plain")

    def _on_display(
        self, data: dict, metadata: dict | None = None, *args: Any, **kwargs: Any
    ) -> None:
        self._displays.append(data.get("text/plain", ""))

    def _cancel_leftover_tasks(self) -> None:
        """An interrupted ``await`` cell leaves its task in IPython's loop: cancel it."""
        from IPython.core.async_helpers import get_asyncio_loop

        loop = get_asyncio_loop()
        tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks and not loop.is_running():
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def shutdown(self) -> None:
        if self._manager is not None:
            self._manager.shutdown_kernel()
            self._manager = self._kernel = None


_site_completed = False


def complete_site() -> None:
    """Run ``site`` now if the server started with ``python -S`` (to be ready sooner): cells see
    the interpreter's usual ``sys.path``, ``.pth`` files (editable installs) processed."""
    global _site_completed
    if sys.flags.no_site and not _site_completed:
        import site

        site.main()
        _site_completed = True


def _plain_traceback(stb: list[str]) -> str:
    """The traceback without colours and without our SIGINT handler's own frame."""
    frames = [ANSI.sub("", part) for part in stb]
    return "\n".join(f for f in frames if "MainThreadRunner._on_sigint" not in f)


class IPythonTool:
    """The asyncio side: submits cells to the main thread and enforces the timeout."""

    def __init__(
        self,
        runner: MainThreadRunner,
        max_output: int,
        grace_s: float = 3.0,
        ipython_dir: Path | None = None,
    ) -> None:
        self.runner, self.grace_s = runner, grace_s
        self.session = KernelSession(runner, max_output, ipython_dir)
        self._lock = asyncio.Lock()

    async def __call__(self, args: IPythonArgs) -> IPythonResult:
        async with self._lock:
            if self.runner.busy:
                raise ToolError(
                    "the kernel is still running an earlier cell that ignored the "
                    "interrupt; recycle the sandbox",
                    "kernel_busy",
                )
            if not self.session.started:
                await self._on_main(self.session.start, KERNEL_START_TIMEOUT_S)
            future = self.runner.submit(self.session.execute, args.code)
            waiter = asyncio.wrap_future(future)
            done, _ = await asyncio.wait({waiter}, timeout=args.timeout_s)
            if not done:
                return await self._interrupt(future, waiter)
            return waiter.result()

    async def _interrupt(self, future: Future, waiter: asyncio.Future) -> IPythonResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while not waiter.done() and loop.time() < deadline:
            self.runner.interrupt(future)
            await asyncio.wait({waiter}, timeout=POLL_S)
        if waiter.done():
            return msgspec.structs.replace(waiter.result(), timed_out=True)
        return IPythonResult(
            timed_out=True,
            kernel_busy=True,
            error="Timeout: the cell did not stop on KeyboardInterrupt",
        )

    async def warm(self) -> None:
        """Start the kernel now (a warm pool's sandbox): no cell runs, so the job's first
        cell is ``In[1]`` as in a cold sandbox."""
        async with self._lock:
            if not self.session.started and not self.runner.busy:
                await self._on_main(self.session.start, KERNEL_START_TIMEOUT_S)

    async def _on_main(self, fn, timeout_s: float):
        waiter = asyncio.wrap_future(self.runner.submit(fn))
        return await asyncio.wait_for(waiter, timeout_s)
