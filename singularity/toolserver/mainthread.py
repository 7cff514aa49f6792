"""Run work on the main thread, where signals land, so that a running cell can be interrupted.

The tool server's asyncio loop runs in a second thread; the main thread only runs the IPython
kernel's cells, one at a time. Python delivers signal handlers on the main thread only, and a
SIGINT wakes the main thread from a blocking call (``time.sleep``, ``select``, a lock), so
``signal.pthread_kill(main, SIGINT)`` is the one way to stop ``time.sleep(100)`` as well as
``while True: pass`` inside the process. (``PyThreadState_SetAsyncExc`` on a worker thread would
stop the loop but not the sleep.)

Interrupts are targeted: :meth:`MainThreadRunner.interrupt` names the job it means, and the
SIGINT handler raises ``KeyboardInterrupt`` only while that job's *user code* runs (the job marks
it with :meth:`set_user_code`), never inside the kernel's own bookkeeping; a SIGINT that lands
elsewhere is dropped and the caller sends another. A SIGINT that nobody asked for (Ctrl-C on
the terminal running the server) asks the server to stop.

SIGTERM and SIGHUP are also caught here, but reported through :func:`signal.set_wakeup_fd` to a
socket the asyncio thread reads: that works even while a cell is stuck in C code and the main
thread cannot run Python handlers.
"""

from __future__ import annotations

import queue
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Job:
    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.future: Future[Any] = Future()


class MainThreadRunner:
    """A single-worker executor whose worker is the main thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._current: _Job | None = None
        self._interrupt_for: _Job | None = None
        self._in_user_code = False
        self._stopping = threading.Event()
        self.on_external_interrupt: Callable[[], object] = lambda: None  # what it returns is ignored
        self.wakeup_reader, self._wakeup_writer = socket.socketpair()
        main_ident = threading.main_thread().ident
        assert main_ident is not None  # the main thread has started: it is running this
        self._main_ident: int = main_ident

    # -- from any thread -------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        job = _Job(fn, args)
        self._queue.put(job)
        return job.future

    @property
    def busy(self) -> bool:
        return self._current is not None

    def interrupt(self, future: Future) -> bool:
        """Send SIGINT to the main thread if the job of ``future`` is running; True if sent."""
        job = self._current
        if job is None or job.future is not future:
            return False
        self._interrupt_for = job
        signal.pthread_kill(self._main_ident, signal.SIGINT)
        return True

    def interrupt_current(self) -> bool:
        """Interrupt whatever job is running (used when the server stops)."""
        job = self._current
        return job is not None and self.interrupt(job.future)

    def stop(self) -> None:
        self._stopping.set()
        self._queue.put(None)

    # -- on the main thread ----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """Call on the main thread before starting the server thread."""
        self._wakeup_writer.setblocking(False)
        self.wakeup_reader.setblocking(False)
        signal.set_wakeup_fd(self._wakeup_writer.fileno(), warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: None)  # reported through the wakeup fd
        signal.signal(signal.SIGINT, self._on_sigint)

    def set_user_code(self, running: bool) -> None:
        """Mark the span where an interrupt may raise KeyboardInterrupt (the cell's own code)."""
        self._in_user_code = running

    def run(self) -> None:
        """Serve jobs until :meth:`stop` (blocks the main thread)."""
        while not self._stopping.is_set():
            job = self._queue.get()
            if job is None:
                continue
            self._run_job(job)

    def _run_job(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        self._current = job
        try:
            result = job.fn(*job.args)
        except BaseException as exc:  # noqa: BLE001 - even a stray KeyboardInterrupt goes back
            self._current = None
            job.future.set_exception(exc)
        else:
            self._current = None
            job.future.set_result(result)
        finally:
            self._interrupt_for = None
            self._in_user_code = False

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # No locks here: the handler may run while the main thread holds any of them.
        target = self._interrupt_for
        if target is None:
            self.on_external_interrupt()
            return
        if target is self._current and self._in_user_code:
            self._interrupt_for = None
            raise KeyboardInterrupt
