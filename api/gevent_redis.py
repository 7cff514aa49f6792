"""redis-py's idle-connection check without gevent's cooperative ``poll`` (gateway only).

Every command redis-py sends first checks that the pooled connection it took holds no stale
data: a zero-timeout ``select.poll()`` on its socket (``redis._parsers.hiredis._socket_can_read``).
Under gunicorn's gevent worker ``select.poll`` is gevent's cooperative one, which for each check
builds a watcher per socket and a ``gevent.Timeout`` and goes through the hub: 7-8 % of a
gateway worker's CPU in a py-spy profile of sequential ``/process`` requests (four commands per
job). A zero-timeout poll never blocks, so the OS ``poll`` answers the same question at once
without yielding; any other timeout (a pub/sub ``get_message(timeout=...)``) still goes to
gevent's, which must not block the hub.
"""
from __future__ import annotations

import select
from typing import Any


def install() -> bool:
    """Use the OS ``poll`` for redis-py's zero-timeout readiness checks when gevent has patched
    ``select``; returns whether it did (not patched, or redis-py without that helper: no-op)."""
    try:
        from gevent import monkey
    except ImportError:
        return False
    if not monkey.is_module_patched("select"):
        return False
    from redis._parsers import hiredis

    cooperative = getattr(hiredis, "_socket_can_read", None)
    if cooperative is None or getattr(cooperative, "os_poll_for_zero_timeout", False):
        return cooperative is not None
    os_poll = monkey.get_original("select", "poll")

    def socket_can_read(sock: Any, timeout: float | None) -> bool:
        if timeout != 0 or (hasattr(sock, "pending") and sock.pending()):  # TLS buffers: as redis-py does
            return bool(cooperative(sock, timeout))
        poller = os_poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))

    socket_can_read.os_poll_for_zero_timeout = True  # type: ignore[attr-defined]
    hiredis._socket_can_read = socket_can_read
    return True
