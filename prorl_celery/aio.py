"""An asyncio event loop per worker thread, so async handlers run on Celery's thread pool.

The loops are uvloop's when it is installed (it is a dependency) and ``PRORL_UVLOOP`` is not
``0``: a RUN stage's tool calls and LLM requests are many small round trips, and uvloop's loop
costs a third less per tool-server call than asyncio's own (``python -m bench.tools``).
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = new_event_loop()
    return loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop unless it is missing or ``PRORL_UVLOOP=0``; asyncio's otherwise."""
    if os.environ.get("PRORL_UVLOOP", "1") != "0":
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
