"""Two Redis faults back to back (issue 40; bench/results/chaos.md, seed 7): the primary dies
while its one replica, restarted after the previous failover, is still on its first sync.

Before, the sentinels promoted that replica with nothing but its own old data, and every write
since its death (jobs the gateway had accepted among them) was gone. Now a restarted member
rejoins held back (``replica-priority 0``) until it is in sync, so the sentinels cannot promote
it, and the supervision starts the dead primary again in place, on its append-only file.

Real ``redis-server`` and ``redis-sentinel`` processes (``SentinelGroup``, as ``prorl up --redis
sentinel`` starts them), SIGKILLed.
"""
from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator

import pytest
import redis

from prorl_celery.dev.local import redis_server_binary
from prorl_celery.dev.sentinel import PROMOTABLE_PRIORITY, SentinelGroup
from tests.support.services import eventually, redis_answers

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="redis-sentinel is not installed"),
    pytest.mark.integration,
]


@pytest.fixture
def group(tmp_path) -> Iterator[SentinelGroup]:
    binary = redis_server_binary()
    assert binary is not None
    started = SentinelGroup(binary, tmp_path / "redis", persist=True)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def kill(group: SentinelGroup, port: int) -> None:
    process = group.processes[group.server_named(port)]
    os.kill(process.popen.pid, signal.SIGKILL)
    process.popen.wait(10)


def server(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=3, decode_responses=True)


def test_a_primary_lost_while_its_replica_resyncs_comes_back_with_its_data(group):
    first = group.primary_port()
    server(first).set("before", "1")
    assert server(first).wait(1, 2000) == 1
    kill(group, first)
    second = group.wait_failed_over(first)
    assert group.restart_dead() == [group.server_named(first)]
    rejoined = group.server_named(first)
    assert rejoined in group.held_back
    assert server(first).config_get("replica-priority")["replica-priority"] == "0"

    # written on the new primary while the old one is still loading or syncing: only here
    for i in range(200):
        server(second).set(f"after-{i}", str(i))
    kill(group, second)

    # no replica the sentinels may promote: the primary starts again in place, at once
    assert group.restart_dead() == [group.server_named(second)]
    eventually(lambda: redis_answers(lambda: server(second).get("after-199") == "199"), 20,
               "the primary back with its append-only file")
    assert server(second).get("before") == "1"
    assert group.primary_port() == second, "the sentinels failed over to a replica that was not in sync"

    # once the held-back replica has synced from it, it may be failed over to again
    eventually(lambda: _released(group, rejoined), 60, "the rejoined replica released once in sync")
    assert server(first).config_get("replica-priority")["replica-priority"] == str(PROMOTABLE_PRIORITY)
    assert server(first).get("after-199") == "199"
    kill(group, second)
    assert group.wait_failed_over(second) == first
    assert server(first).get("after-0") == "0"


def test_a_dead_primary_with_a_synced_replica_still_waits_for_the_failover(group):
    first = group.primary_port()
    kill(group, first)
    assert group.restart_dead() == [], "restarted in place although its replica could take over"
    second = group.wait_failed_over(first)
    assert second != first
    assert group.restart_dead() == [group.server_named(first)]


def _released(group: SentinelGroup, name: str) -> bool:
    group.restart_dead()
    return name not in group.held_back
