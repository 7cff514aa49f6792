"""A Redis Sentinel group on this machine: a primary, one replica and three ``redis-sentinel``
processes on loopback ports (``prorl up --redis sentinel``, and the tests' fixture).

The sentinels watch the primary under one master name, quorum 2 of 3; a primary silent for
``down_after_ms`` is failed over to the replica. Each server keeps an append-only file in its own
directory (``persist``), or nothing on disk. docs/running.md, "Redis Sentinel", says what each
setting can lose and what it costs.

A member that died rejoins held back (``replica-priority 0``) until its first sync from the
primary has finished: the sentinels cannot promote a replica that holds only its own old data. A
primary that dies while its one replica is still held back has no one to fail over to, so it is
started again in place, with its append-only file, rather than lose what only it holds (the
double fault of bench/results/chaos.md, seed 7).
"""
from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from prorl_celery.dev.local import ManagedProcess, free_port, redis_command, wait_until
from prorl_celery.state.connection import DEFAULT_SENTINEL_MASTER

log = logging.getLogger(__name__)

#: how a group starts one of its processes: (name, command) -> the started process
Spawn = Callable[[str, list[str]], ManagedProcess]

SENTINELS = 3
QUORUM = 2
#: the file under the group's directory naming the data directory of its last primary
PRIMARY_MARKER = "primary"
#: one try per command: the supervision asks again on its next look (redis-py's default retries
#: a refused connection for about 4 s, so each dead member would stall every look at the group)
ONCE: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
#: redis-server's default replica-priority, given back to a held-back replica once it is in sync
PROMOTABLE_PRIORITY = 100


def sentinel_config(port: int, directory: Path, master_name: str, primary_port: int, *,
                    down_after_ms: int, failover_timeout_ms: int) -> str:
    """One sentinel's configuration file (it rewrites the file as it learns the group)."""
    return "\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {directory}",
        f"sentinel monitor {master_name} 127.0.0.1 {primary_port} {QUORUM}",
        f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
        f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
        f"sentinel parallel-syncs {master_name} 1", ""])


def sentinel_command(redis_server: str, config: Path) -> list[str]:
    """Debian's ``redis-sentinel`` (package redis-sentinel) on ``config``, else
    ``redis-server <config> --sentinel``."""
    found = shutil.which("redis-sentinel")
    return [found, str(config)] if found else [redis_server, str(config), "--sentinel"]


@dataclass
class SentinelGroup:
    """Start with ``start()`` (returns the ``sentinel://`` URL), stop with ``stop()``."""

    redis_server: str
    #: configuration files and logs; each server's data under it when ``persist``
    directory: Path
    persist: bool = True
    master_name: str = DEFAULT_SENTINEL_MASTER
    #: a primary silent this long is failed over (redis-sentinel's default is 30 s)
    down_after_ms: int = 2000
    failover_timeout_ms: int = 10000
    #: how processes start (LocalCluster passes its own, which logs and supervises them)
    spawn: Spawn | None = None
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    #: each server's data directory under ``directory`` (server-1, server-2)
    data_dirs: dict[str, str] = field(default_factory=dict)
    #: servers restarted as replicas whose first sync has not finished (not promotable)
    held_back: set[str] = field(default_factory=set)
    #: when each member was first seen dead (monotonic seconds)
    dead_since: dict[str, float] = field(default_factory=dict)

    def _data_dirs(self) -> tuple[str, str]:
        """(the primary's, the replica's): the one that was primary when the group last stopped
        starts as the primary, so that a restart after a failover keeps the newest data."""
        marker = self.directory / PRIMARY_MARKER
        last = marker.read_text().strip() if marker.exists() else "server-1"
        return (last, "server-2" if last == "server-1" else "server-1")

    def remember_primary(self) -> None:
        """Note which data directory the sentinels' primary writes (read by the next start)."""
        if self.persist:
            name = self.data_dirs.get(self.server_named(self.primary_port()))
            if name:
                (self.directory / PRIMARY_MARKER).write_text(name + "\n")

    @property
    def sentinel_ports(self) -> list[int]:
        return [self.ports[f"redis-sentinel-{i}"] for i in range(1, SENTINELS + 1)]

    def url(self, db: int | None = None) -> str:
        """The group's ``sentinel://`` URL (kombu's form: one part per sentinel)."""
        path = "" if db is None else f"/{db}"
        return ";".join(f"sentinel://127.0.0.1:{port}{path}" for port in self.sentinel_ports)

    def start(self, timeout_s: float = 60.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in ("redis", "redis-replica", *(f"redis-sentinel-{i}" for i in range(1, SENTINELS + 1))):
            self.ports[name] = free_port()
        primary = self.ports["redis"]
        for name, data_name in zip(("redis", "redis-replica"), self._data_dirs()):
            data = self.directory / data_name
            data.mkdir(exist_ok=True)
            command = redis_command(self.redis_server, self.ports[name], data if self.persist else None)
            if self.persist:
                self.data_dirs[name] = data_name
            else:  # a replica's full sync still writes an RDB file: into its directory, not the cwd
                command += ["--dir", str(data)]
            self.commands[name] = command if name == "redis" else [*command, "--replicaof", "127.0.0.1", str(primary)]
        for port, name in zip(self.sentinel_ports, [n for n in self.ports if n.startswith("redis-sentinel")]):
            config = self.directory / f"{name}.conf"
            config.write_text(sentinel_config(port, self.directory, self.master_name, primary,
                                              down_after_ms=self.down_after_ms,
                                              failover_timeout_ms=self.failover_timeout_ms))
            self.commands[name] = sentinel_command(self.redis_server, config)
        for name in self.commands:
            self._start(name)
        self.wait_ready(timeout_s)
        return self.url()

    def _start(self, name: str) -> ManagedProcess:
        process = (self.spawn or self._spawn_here)(name, self.commands[name])
        self.processes[name] = process
        return process

    def _spawn_here(self, name: str, command: list[str]) -> ManagedProcess:
        log = self.directory / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        return ManagedProcess(name, popen, log)

    def sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=3, socket_connect_timeout=3, decode_responses=True, **ONCE)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the replica follows the primary and every sentinel knows both and the other two
        (a failover needs a quorum that has met)."""
        def replica_linked() -> bool:  # the member that is not the primary (after a failover: "redis")
            primary = self.primary_port()
            replica = next(self.ports[name] for name in ("redis", "redis-replica") if self.ports[name] != primary)
            info = redis.Redis(port=replica, socket_timeout=3, **ONCE).info("replication")
            return info.get("master_link_status") == "up"

        def sentinels_met() -> bool:
            for port in self.sentinel_ports:
                state = cast(dict[str, Any], self.sentinel_client(port).sentinel_master(self.master_name))
                if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < SENTINELS - 1:
                    return False
            return True

        wait_until(lambda: _answers(replica_linked), timeout_s, "the Redis replica's link to its primary",
                   self.processes.get("redis-replica"))
        wait_until(lambda: _answers(sentinels_met), timeout_s, "three sentinels that know the primary, the replica "
                   "and each other", self.processes.get("redis-sentinel-1"))

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now (the first that answers)."""
        named = self._named_primaries(first_only=True)
        if not named:
            raise RuntimeError("no sentinel names a primary")
        return named[0]

    def agreed_primary_port(self) -> int | None:
        """The primary's port when every sentinel names the same one, else None (just after a
        failover the sentinels learn it from each other within a second or two)."""
        named = self._named_primaries()
        return named[0] if len(named) == SENTINELS and len(set(named)) == 1 else None

    def _named_primaries(self, first_only: bool = False) -> list[int]:
        named = []
        for port in self.sentinel_ports:
            try:
                address = self.sentinel_client(port).sentinel_get_master_addr_by_name(self.master_name)
                _host, primary = cast(tuple[str, str], address)
            except (redis.RedisError, TypeError):
                continue
            named.append(int(primary))
            if first_only:
                break
        return named

    def server_named(self, port: int) -> str:
        return next(name for name, own in self.ports.items() if own == port)

    def restart(self, name: str, *, in_place: bool = False) -> ManagedProcess:
        """Start a stopped member again on its port; a server as the replica of the primary
        every sentinel names (None of them agreeing: RuntimeError), held back until its first
        sync ends (``release_synced``). A former primary started on its own would serve as a
        primary, its old data and all, until the sentinels turned it into a replica, and a
        sentinel that had not yet heard of the failover could send clients to it.

        ``in_place``: the server is the sentinels' primary still (no replica could take over):
        it starts as a primary again, on its own append-only file."""
        if not name.startswith("redis-sentinel"):
            command = _without(_without(self.commands[name], "--replicaof", 2), "--replica-priority", 1)
            if in_place:
                self.commands[name] = command
            else:
                primary = self.agreed_primary_port()
                if primary is None or primary == self.ports[name]:
                    raise RuntimeError(f"the sentinels do not agree on a primary other than {name}: "
                                       "not restarting it")
                self.commands[name] = [*command, "--replicaof", "127.0.0.1", str(primary), "--replica-priority", "0"]
                self.held_back.add(name)
            if not self.persist:  # a replica's last full sync left an RDB file: start empty, not from it
                (self.directory / self._data_dir_name(name) / "dump.rdb").unlink(missing_ok=True)
        self.dead_since.pop(name, None)
        return self._start(name)

    def _data_dir_name(self, name: str) -> str:
        command = self.commands[name]
        return Path(command[command.index("--dir") + 1]).name

    def release_synced(self) -> list[str]:
        """Make promotable again (``replica-priority`` back to the default) each held-back
        replica whose sync from the primary has finished. Returns their names."""
        released = []
        for name in sorted(self.held_back):
            try:
                server = redis.Redis(port=self.ports[name], socket_timeout=2, decode_responses=True, **ONCE)
                info = server.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up" or \
                        int(info.get("master_sync_in_progress", 1)):
                    continue
                server.config_set("replica-priority", PROMOTABLE_PRIORITY)
            except redis.RedisError:
                continue
            self.held_back.discard(name)
            released.append(name)
            log.info("%s is in sync with its primary: it can be failed over to again", name)
        return released

    def restart_dead(self, *, failover_wait_s: float | None = None) -> list[str]:
        """Start again every member that exited, and release the replicas now in sync.

        A dead server that the sentinels no longer name the primary starts as the new primary's
        replica. One they still name waits for their failover (restarted before it, an empty
        primary, with no persistence, would be followed by the replica, which would drop
        everything it holds), unless no replica can take over: the other server is dead too or
        still held back, or no failover came within ``failover_wait_s`` (default: down-after
        plus failover-timeout). Then it starts in place, on its own append-only file."""
        self.release_synced()
        now = time.monotonic()
        dead = [name for name, process in self.processes.items() if process.popen.poll() is not None]
        for name in dead:
            self.dead_since.setdefault(name, now)
        if not dead:
            return []
        wait_s = (self.down_after_ms + self.failover_timeout_ms) / 1000 if failover_wait_s is None else failover_wait_s
        agreed = self.agreed_primary_port()
        restarted = []
        for name in dead:
            if name.startswith("redis-sentinel") or (agreed is not None and agreed != self.ports[name]):
                log.warning("%s exited (%s); starting it again", name, self.processes[name].popen.returncode)
                self.restart(name)
                restarted.append(name)
            elif agreed == self.ports[name]:
                other = next(n for n in ("redis", "redis-replica") if n != name)
                stranded = other in dead or other in self.held_back
                if stranded or now - self.dead_since[name] > wait_s:
                    why = "its replica is not in sync" if stranded else f"no failover within {wait_s:.0f} s"
                    log.warning("primary %s exited and %s: starting it again in place", name, why)
                    self.restart(name, in_place=True)
                    restarted.append(name)
        return restarted

    def wait_failed_over(self, old_port: int, timeout_s: float = 60.0) -> int:
        """Until every sentinel names a primary other than ``old_port``, and it accepts writes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                port = self.agreed_primary_port()
                if port is not None and port != old_port and \
                        redis.Redis(port=port, socket_timeout=2, **ONCE).info("replication")["role"] == "master":
                    self.remember_primary()
                    return port
            except (redis.RedisError, RuntimeError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"no failover from port {old_port} within {timeout_s:.0f} s")

    def stop(self, grace_s: float = 10.0) -> None:
        """Sentinels first (a primary stopping under their eyes would be failed over), then the
        replica, then the primary."""
        try:
            self.remember_primary()
        except (RuntimeError, OSError, StopIteration) as error:
            log.warning("cannot tell which server is the primary (%s): the next start takes %s", error,
                        self.data_dirs.get("redis"))
        order = sorted(self.processes, key=lambda name: ("sentinel" not in name, name == "redis"))
        for name in order:
            self.processes[name].stop(grace_s)
        self.processes.clear()


def _without(command: list[str], flag: str, values: int) -> list[str]:
    """``command`` without ``flag`` and the ``values`` arguments after it."""
    if flag not in command:
        return command
    at = command.index(flag)
    return command[:at] + command[at + 1 + values:]


def _answers(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except (redis.RedisError, KeyError, ValueError, RuntimeError):  # RuntimeError: no sentinel answers yet
        return False
