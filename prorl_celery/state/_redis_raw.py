"""redis-py's connection-level calls, used here and nowhere else (pinned: ``TESTED_WITH``).

The completion listener (``waiting``) reads the ended-jobs stream and the records of the waits
it wakes on a connection of its own, held from one read to the next, instead of through the
client: a read through the client (pool checkout and release, retries, redis-py's metrics
hooks) ran about 150 Python calls, once per wake-up in every gateway process. These two
functions are the whole of that: ``Connection.send_command``, ``send_packed_command``,
``pack_commands`` and ``read_response``, which redis-py documents but may change between
releases.

``tests/integration/test_library_internals.py`` fails, naming the version, on a redis-py outside
``TESTED_WITH``, and runs both against a real server.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
