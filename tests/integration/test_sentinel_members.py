"""A Sentinel group whose hosts each supervise their own share (``prorl sentinel member``, as
deploy/slurm/prorl.sbatch runs it with PRORL_REDIS_REPLICATION=sentinel), here three members
on loopback ports: slot 0 the first primary and a sentinel, slot 1 the replica and a sentinel,
slot 2 a sentinel. Real ``redis-server`` and ``redis-sentinel`` processes, with a password,
SIGKILLed; the members are the ``prorl`` command itself.

- A primary SIGKILLed is failed over, and its member brings it back as the new primary's
  replica, held back until it is in sync.
- The double fault of bench/results/chaos.md, seed 7, across members: the primary dies while the
  only replica is down; the primary's member starts it again in place, with its data, at once.
- SIGTERM (Slurm's end) does not stop a member started with --outlive-term; ``prorl sentinel
  stop`` stops every one, and the marker names the last primary's data.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from prorl_celery.dev.local import free_port
from prorl_celery.dev.sentinel import PRIMARY_MARKER, PROMOTABLE_PRIORITY
from prorl_celery.dev.sentinel_member import ONCE, sentinel_replicas
from tests.support.services import eventually, redis_answers

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="redis-sentinel is not installed"),
    pytest.mark.integration,
    pytest.mark.extended,  # about 1.5 min: the rules themselves run in the default run (test_sentinel_double_fault)
]

PASSWORD = "s3cret pass"
MASTER = "prorl"
GROUP = "test-group"


@dataclass
class Group:
    directory: Path
    ports: list[int]  # slot 0's server, slot 1's server
    sentinel_ports: list[int]
    members: list[subprocess.Popen]
    env: dict[str, str]

    def server(self, slot: int) -> redis.Redis:
        return redis.Redis(port=self.ports[slot], password=PASSWORD, socket_timeout=3, decode_responses=True, **ONCE)

    def named_primary(self) -> int | None:
        try:
            named = redis.Redis(port=self.sentinel_ports[2], password=PASSWORD, socket_timeout=2, **ONCE) \
                .sentinel_get_master_addr_by_name(MASTER)
        except redis.RedisError:
            return None
        return int(named[1]) if named else None

    def kill_server(self, slot: int) -> None:
        pid = int(self.server(slot).info("server")["process_id"])
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: not _alive(pid), 10, f"slot {slot}'s redis-server gone")

    def prorl(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "prorl_celery.cli", "sentinel", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def _all_down(replicas: list[dict[str, str]]) -> bool:
    return bool(replicas) and all("s_down" in replica["flags"].split(",") for replica in replicas)


@pytest.fixture
def group(tmp_path) -> Iterator[Group]:
    ports, sentinel_ports = [free_port(), free_port()], [free_port() for _ in range(3)]
    directory = tmp_path / "redis"
    env = {**os.environ, "PRORL_REDIS_PASSWORD": PASSWORD, "PRORL_REDIS_SENTINEL_PASSWORD": PASSWORD,
           "PRORL_REDIS_WAIT_REPLICAS": "1",
           "PRORL_REDIS_URL": ";".join(f"sentinel://{':s3cret%20pass@' if i == 0 else ''}127.0.0.1:{port}/1"
                                       for i, port in enumerate(sentinel_ports))}
    sentinels = [arg for port in sentinel_ports for arg in ("--sentinel", f"127.0.0.1:{port}")]
    members = []
    for slot in range(3):
        command = [sys.executable, "-m", "prorl_celery.cli", "sentinel", "member", "--slot", str(slot),
                   "--primary-host", "127.0.0.1", "--primary-port", str(ports[0]), *sentinels,
                   "--dir", str(directory), "--bind", "127.0.0.1", "--address", "127.0.0.1",
                   "--port", str(ports[min(slot, 1)]), "--sentinel-port", str(sentinel_ports[slot]),
                   "--group-id", GROUP, "--down-after-ms", "1000", "--failover-timeout-ms", "5000",
                   "--outlive-term"]
        log = open(tmp_path / f"member-{slot}.log", "w")
        members.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))
    started = Group(directory, ports, sentinel_ports, members, env)
    try:
        waited = started.prorl("wait", "--timeout", "60")
        assert waited.returncode == 0, waited.stderr
        yield started
    finally:
        for member in members:
            if member.poll() is None:
                os.killpg(member.pid, signal.SIGKILL)
        for port in ports:  # the servers are in sessions of their own
            try:
                redis.Redis(port=port, password=PASSWORD, socket_timeout=1, **ONCE).shutdown(nosave=True, now=True)
            except redis.RedisError:
                pass
        for port in sentinel_ports:
            try:
                redis.Redis(port=port, password=PASSWORD, socket_timeout=1, **ONCE).shutdown()
            except redis.RedisError:
                pass
        for slot in range(3):
            print(f"--- member {slot}:\n" + (tmp_path / f"member-{slot}.log").read_text()[-3000:])


def test_members_fail_over_rejoin_held_back_and_stop_together(group):
    first, second = group.ports
    assert group.named_primary() == first
    primary = group.server(0)
    for i in range(500):
        primary.set(f"k{i}", i)
    assert primary.wait(1, 2000) == 1

    group.kill_server(0)
    eventually(lambda: group.named_primary() == second, 30, "the failover to slot 1")
    assert group.server(1).get("k499") == "499"
    # slot 0's member brings its server back as the new primary's replica, in sync and released
    eventually(lambda: redis_answers(lambda: group.server(0).info("replication")["role"] == "slave"), 30,
               "slot 0 back as a replica")
    eventually(lambda: redis_answers(lambda: group.server(0).config_get("replica-priority")["replica-priority"]
                                == str(PROMOTABLE_PRIORITY)), 30, "slot 0 released once in sync")
    assert group.server(0).get("k499") == "499"
    eventually(lambda: (group.directory / PRIMARY_MARKER).read_text().strip() == "server-2", 10,
               "the marker naming slot 1's data")

    # SIGTERM, as Slurm sends it to every process of an allocation: the members outlive it
    for member in group.members:
        os.killpg(member.pid, signal.SIGTERM)
    time.sleep(1.5)
    assert all(member.poll() is None for member in group.members)
    assert group.server(1).ping()

    stopped = group.prorl("stop", "--group-id", GROUP)
    assert stopped.returncode == 0, stopped.stderr
    for member in group.members:
        member.wait(30)
    assert [member.returncode for member in group.members] == [0, 0, 0]
    for port in [*group.ports, *group.sentinel_ports]:
        with pytest.raises(redis.ConnectionError):
            redis.Redis(port=port, password=PASSWORD, socket_timeout=1, **ONCE).ping()
    assert (group.directory / PRIMARY_MARKER).read_text().strip() == "server-2"


def test_a_primary_lost_while_its_only_replica_is_down_starts_again_in_place(group):
    first, _second = group.ports
    primary = group.server(0)
    for i in range(200):
        primary.set(f"k{i}", i)
    assert primary.wait(1, 2000) == 1
    # slot 1's member paused (as a host that hangs), then its server killed: no replica is left
    os.kill(group.members[1].pid, signal.SIGSTOP)
    try:
        group.kill_server(1)
        sentinel = redis.Redis(port=group.sentinel_ports[2], password=PASSWORD, decode_responses=True)
        eventually(lambda: _all_down(sentinel_replicas(sentinel, MASTER)), 20,
                   "the sentinels seeing the replica down")
        for i in range(200, 300):
            primary.set(f"k{i}", i)
        killed = time.monotonic()
        group.kill_server(0)
        eventually(lambda: redis_answers(lambda: group.server(0).get("k299") == "299"), 20,
                   "the primary back in place with its append-only file")
        back_s = time.monotonic() - killed
        assert back_s < 5, f"{back_s:.1f} s: it waited for a failover that could not come"
        assert group.named_primary() == first
    finally:
        os.kill(group.members[1].pid, signal.SIGCONT)
    # the paused host's server rejoins as a replica and catches up
    eventually(lambda: redis_answers(lambda: group.server(1).get("k299") == "299"), 30, "slot 1 back in sync")
    assert group.server(1).info("replication")["role"] == "slave"
    print(f"a primary with no replica to fail over to was back in {back_s:.1f} s")
