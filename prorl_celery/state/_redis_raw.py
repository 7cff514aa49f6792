"""redis-py's connection-level calls, used here and nowhere else (pinned: ``TESTED_WITH``).

The completion listener (``waiting``) reads the ended-jobs stream and the records of the waits
it wakes on a connection of its own, held from one read to the next, instead of through the
client: a read through the client (pool checkout and release, retries, redis-py's metrics
hooks) ran about 150 Python calls, once per wake-up in every gateway process. These two
functions are the whole of that: ``Connection.send_command``, ``send_packed_command``,
``pack_commands`` and ``read_response``, which redis-py documents but may change between
releases.

``FailoverAwareConnection`` mends a reconnect that redis-py makes to a stale address after a
Sentinel failover (see there).

``tests/integration/test_library_internals.py`` fails, naming the version, on a redis-py outside
``TESTED_WITH``, and runs both against a real server.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.sentinel import SentinelManagedConnection

#: the redis-py releases (major.minor) this module was written and measured against
TESTED_WITH = ("8.0", "8.1")


def command(connection: Any, *args: Any) -> Any:
    """Send one command on ``connection`` and read its reply as Redis sends it."""
    connection.send_command(*args)
    return connection.read_response()


def commands(connection: Any, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``calls`` at once on ``connection`` (one write) and read their replies in order."""
    connection.send_packed_command(connection.pack_commands(calls))
    return [connection.read_response() for _ in calls]


class FailoverAwareConnection(SentinelManagedConnection):
    """redis-py's Sentinel-managed connection, asking the sentinels for the primary on every
    reconnect.

    redis-py 8 reconnects a dropped connection inside ``send_packed_command`` through
    ``connect_check_health``, which dials the address the connection had: only ``connect()`` asks
    the sentinels. A command retried through a failover (``PRORL_REDIS_RETRY_S``) went to the dead
    primary on every try and failed when its retries ran out, though a new primary had long been
    elected. kombu's Sentinel channel (``worker._kombu``) uses this class too."""

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)
