"""Event loops for the stages: one per worker thread, and one per process that RUN stages share.

The loops are uvloop's when it is installed (it is a dependency) and ``PRORL_UVLOOP`` is not
``0``: a RUN stage's tool calls and LLM requests are many small round trips, and uvloop's loop
costs a third less per tool-server call than asyncio's own (``python -m bench.tools``).

INIT and EVAL stages run on the thread Celery gives them (``run_coro``, on that thread's own
loop). RUN stages are long and mostly wait on the LLM, so a RUN worker runs them all as tasks of
one :class:`StageLoop`: a thousand of them cost a thousand coroutines, not a thousand threads
contending for the GIL (``python -m bench.burst``).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
_local = threading.local()
log = logging.getLogger(__name__)


def thread_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = new_event_loop()
    return loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop unless it is missing or ``PRORL_UVLOOP=0``; asyncio's otherwise."""
    from prorl_celery.core.settings import get_settings

    if get_settings().uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_coro(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on this thread's own, long-lived event loop.

    The loop outlives the call so per-loop resources (HTTP connection pools) are reused by
    the next stage this thread executes.
    """
    return thread_loop().run_until_complete(coro)


class StageClosed(Exception):
    """The stage loop takes no more stages: the worker is shutting down."""


class StageLoop:
    """One event loop, on a thread of its own, running at most ``slots`` stages at once.

    ``admit`` is called from a Celery pool thread: it takes a slot (waiting while all are
    busy), lets the caller claim the job, and schedules the stage coroutine it gets back; the
    slot is free again when that coroutine ends. The slots are the worker's backpressure: the
    consumer fetches a message only while one is free (``free``), so a worker never holds more
    stages than it can run; ``on_release`` tells it when one frees.
    """

    def __init__(self, slots: int, name: str = "prorl-stages") -> None:
        if slots < 1:
            raise ValueError("a stage loop needs at least one slot")
        self.slots = slots
        self.name = name
        self._busy = 0
        self._closed = False
        self._changed = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock = threading.Lock()
        self._on_release: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the stages running (touched on the loop only)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first use)."""
        if self._loop is None:
            with self._start_lock:
                if self._loop is None:
                    self._loop = self._start()
        return self._loop

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = new_event_loop()
        # asyncio.to_thread (sandbox start and stop) runs on the loop's default executor: with
        # every stage on one loop, its default of cpus + 4 threads would queue a burst of
        # sandbox stops behind each other (each may wait seconds for SIGTERM to take)
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=max(32, self.slots), thread_name_prefix=f"{self.name}-io"))
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            while True:
                try:
                    loop.run_forever()
                    return
                except BaseException:  # noqa: BLE001 - the loop of every stage must go on
                    # a task that raises SystemExit or KeyboardInterrupt (a handler's own task,
                    # which no stage's try can catch) stops run_forever: the task keeps the
                    # exception, so the stage awaiting it ends its job, and the loop runs again
                    log.exception("a stage task stopped %s; it runs on", self.name)

        threading.Thread(target=serve, name=self.name, daemon=True).start()
        ready.wait()
        return loop

    @property
    def busy(self) -> int:
        """Stages running now."""
        return self._busy

    def free(self) -> int:
        """Slots free now (0 once closed)."""
        return 0 if self._closed else max(0, self.slots - self._busy)

    def admit(self, start: Callable[[asyncio.AbstractEventLoop], Coroutine[Any, Any, None] | None]) -> bool:
        """Take a slot, waiting for one; then ``start(loop)`` claims the stage and returns its
        coroutine (None: nothing to run), which runs on the loop holding the slot.

        Returns whether a stage was started. Raises :class:`StageClosed` without calling
        ``start`` once the loop is closed, also while waiting for a slot."""
        with self._changed:
            while not self._closed and self._busy >= self.slots:
                self._changed.wait()
            if self._closed:
                raise StageClosed(f"{self.name} is closed")
            self._busy += 1
        try:
            coro = start(self.loop)
        except BaseException:
            self._release()
            raise
        if coro is None:
            self._release()
            return False
        self._spawn([coro])
        return True

    def admit_many(self, count: int, start: Callable[[asyncio.AbstractEventLoop, int],
                                                     list[Coroutine[Any, Any, None] | None]]) -> int:
        """``admit`` for up to ``count`` stages (a chunk's): waits for one slot like ``admit``,
        then takes as many more as are free now, never waiting for them: ``start(loop, n)``
        claims the first ``n`` and returns their coroutines (None: nothing to run). Returns
        ``n``; the caller hands the rest on (a worker must not sit on stages it has no slot for).
        Raises :class:`StageClosed` without calling ``start`` once the loop is closed."""
        with self._changed:
            while not self._closed and self._busy >= self.slots:
                self._changed.wait()
            if self._closed:
                raise StageClosed(f"{self.name} is closed")
            taken = min(count, self.slots - self._busy)
            self._busy += taken
        try:
            coros = start(self.loop, taken)
        except BaseException:
            for _ in range(taken):
                self._release()
            raise
        started = []
        for coro in coros:
            if coro is None:
                self._release()
            else:
                started.append(coro)
        if started:
            self._spawn(started)
        return taken

    def _spawn(self, coros: list[Coroutine[Any, Any, None]]) -> None:
        """Start the admitted stages on the loop, all in one wake-up of it: a future and a
        wake-up each (``run_coroutine_threadsafe``, whose future nobody reads) cost three
        times the CPU per stage of a chunk's hundred (34 against 11 us)."""
        loop = self.loop

        def start() -> None:
            for coro in coros:
                task = loop.create_task(self._holding_slot(coro))
                # the loop keeps only a weak reference to a task: a stage waiting on a future
                # nothing else holds would be collected mid-flight
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        loop.call_soon_threadsafe(start)

    async def _holding_slot(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException:  # noqa: BLE001 - one stage's crash must not stop the loop of all
            # (SystemExit or KeyboardInterrupt raised in a task would end run_forever)
            log.exception("a stage on %s crashed", self.name)
        finally:
            self._release()

    def on_release(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` whenever a slot frees, on the thread that frees it (the loop's, or
        an admitting one): a consumer that stops fetching while every slot is busy sleeps in its
        poller meanwhile, and nothing else would wake it before its next timer (about 1 s)."""
        self._on_release = callback

    def _release(self) -> None:
        with self._changed:
            self._busy -= 1
            self._changed.notify_all()
        callback = self._on_release
        if callback is not None:
            try:
                callback()
            except Exception:  # noqa: BLE001 - the slot is free anyway; the consumer re-polls within a second
                log.exception("cannot tell the consumer that a slot of %s is free", self.name)

    def close(self) -> None:
        """Take no more stages (waiters get :class:`StageClosed`); running ones go on."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no stage runs, or ``timeout_s`` passes; returns whether idle."""
        with self._changed:
            return self._changed.wait_for(lambda: self._busy == 0, timeout_s)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def started(self) -> bool:
        return self._loop is not None


_stage_loop: StageLoop | None = None
_stage_loop_lock = threading.Lock()


def configure_stage_loop(slots: int) -> StageLoop:
    """Set this process's RUN stage loop to ``slots`` (a worker does it at start-up)."""
    global _stage_loop
    with _stage_loop_lock:
        if _stage_loop is None:
            _stage_loop = StageLoop(slots)
        else:
            with _stage_loop._changed:
                _stage_loop.slots = slots
                _stage_loop._changed.notify_all()
        return _stage_loop


def stage_loop(default_slots: int = 64) -> StageLoop:
    """This process's RUN stage loop (``default_slots`` when no worker configured it)."""
    with _stage_loop_lock:
        if _stage_loop is not None:
            return _stage_loop
    return configure_stage_loop(default_slots)


A = TypeVar("A")


class Batched(Generic[A, T]):
    """Calls made on one event loop in one turn of it, run together: one round trip for many stages.

    ``run_batch(items)`` (Redis, the broker) returns one result per item. The first call of a
    loop iteration schedules the batch for the end of it (``call_soon``); every call made until
    then joins. The batch runs on the loop's thread, blocking it for one round trip: handing it
    to another thread was measured worse (a RUN worker's loop thread then waited for the GIL
    after every wake-up, the hand-over thread and Celery's consumer holding it in turn: a
    thousand-job burst's EVAL hand-overs took 27 s instead of 11). ``run_batch`` raising fails
    every call of its batch.

    A caller cancelled before its batch ran does not take the item out (it may be running):
    ``orphaned(item, result)`` is told of the result nobody took, to undo it (a backend
    assignment is released); with ``shielded`` the caller waits for its item even when
    cancelled, then raises the cancellation (a stage message must be published once the job
    was handed over, or the job is stranded)."""

    def __init__(self, run_batch: Callable[[list[A]], list[T]], *,
                 orphaned: Callable[[A, T], None] | None = None, shielded: bool = False) -> None:
        self._run_batch = run_batch
        self._orphaned = orphaned
        self._shielded = shielded
        self._queued: list[tuple[A, asyncio.Future[T]]] = []
        self.batches = 0  # batches run (the tests count them)

    async def __call__(self, item: A) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._flush)
        self._queued.append((item, future))
        if not self._shielded:
            try:
                return await future
            except asyncio.CancelledError:
                # cancelled after the batch set its result, before this task resumed to take it
                if future.done() and not future.cancelled() and self._orphaned is not None:
                    self._orphaned(item, future.result())
                raise
        cancelled = False
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        return future.result()

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        if not batch:
            return
        self.batches += 1
        try:
            results = self._run_batch([item for item, _ in batch])
        except Exception as error:  # noqa: BLE001 - each call fails as its own would have
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (item, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)
            elif self._orphaned is not None:  # its caller was cancelled meanwhile
                try:
                    self._orphaned(item, result)
                except Exception:  # noqa: BLE001 - the others' results are in; the lease reaper covers it
                    log.exception("cannot undo an orphaned batch result")


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_per_loop_lock = threading.Lock()


def loop_local(key: Hashable, make: Callable[[], T]) -> T:
    """The running loop's own ``key`` object (made by ``make`` on first use): per-loop
    resources such as a :class:`Batched` belong to one loop. An object's own resources take a
    key that names it, e.g. ``(self, "versions")``."""
    loop = asyncio.get_running_loop()
    with _per_loop_lock:
        objects = _per_loop.setdefault(loop, {})
        if key not in objects:
            objects[key] = make()
        return cast(T, objects[key])
