"""An asyncio event loop per worker thread, so async handlers run on Celery's thread pool."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def run_coro(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on this thread's own, long-lived event loop.

    The loop outlives the call so per-loop resources (HTTP connection pools) are reused by
    the next stage this thread executes.
    """
    return thread_loop().run_until_complete(coro)
