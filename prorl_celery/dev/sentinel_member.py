"""One host's share of a Redis Sentinel group that spans machines (``prorl sentinel member``).

``deploy/slurm/prorl.sbatch`` with ``PRORL_REDIS_REPLICATION=sentinel`` runs one member on
each of its first three nodes: slot 0 the first primary and a sentinel, slot 1 the replica and
a sentinel, slot 2 a sentinel alone. ``dev.sentinel.SentinelGroup`` is the same group on one
machine, supervised from one place; here each host supervises its own processes and learns the
rest from the sentinels, with the same rules (bench/results/chaos.md says why each exists):

- a sentinel that exits starts again on its own configuration file (it rewrites it as it learns);
- a server the sentinels no longer name the primary starts again as the named primary's replica,
  held back (``replica-priority 0``) until its first sync has finished, so that it is never
  promoted while it holds only its own old data;
- a server the sentinels still name the primary waits for their failover, unless no replica can
  take over (every one down or held back) or none came within down-after plus failover-timeout:
  then it starts again in place, on its append-only file.

The servers keep their data in ``server-1`` and ``server-2`` under the group's directory, on a
filesystem the nodes share: the file ``primary`` there names the last primary's, which slot 0
takes at the next start, whichever node it lands on. ``prorl sentinel stop`` ends every member
of the group (sentinels first, the primary last); under Slurm the members ignore SIGTERM
(``--outlive-term``) so that Redis outlives the workers' last writes, as ``head.sh``'s does.
"""
from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import click
import redis
from redis.sentinel import Sentinel

from prorl_celery.dev.local import ManagedProcess, redis_server_binary, wait_until
from prorl_celery.dev.sentinel import ONCE, PRIMARY_MARKER, PROMOTABLE_PRIORITY, QUORUM, SENTINELS, sentinel_command
from prorl_celery.state import keys
from prorl_celery.state.connection import DEFAULT_SENTINEL_MASTER

log = logging.getLogger(__name__)

#: what each slot runs: (its server's first role or None, a sentinel)
SLOTS: dict[int, tuple[str | None, bool]] = {0: ("primary", True), 1: ("replica", True), 2: (None, True)}
#: the key (database 0) whose value, the group's id, tells its members to stop
STOP_KEY = keys.SENTINEL_GROUP_STOP
POLL_S = 0.5
#: a process started this many times within CRASH_WINDOW_S ends the member
CRASH_STARTS, CRASH_WINDOW_S = 5, 30.0


@dataclass
class Member:
    """Run with ``run()``: starts the slot's processes and supervises them until stopped."""

    redis_server: str
    #: the group's directory, shared by its hosts: configuration files, logs, the servers' data
    directory: Path
    slot: int
    #: the first primary's address (slot 0's host)
    primary_host: str
    #: every sentinel's (host, port), this host's included
    sentinels: list[tuple[str, int]]
    #: the address the other hosts reach this one at (resolved from ``socket.gethostname()``)
    address: str
    port: int = 6379
    #: the first primary's port (default: ``port``, as on every host of a Slurm allocation)
    primary_port: int | None = None
    sentinel_port: int = 26379
    bind: str = "0.0.0.0"
    password: str | None = None
    master_name: str = DEFAULT_SENTINEL_MASTER
    #: written into STOP_KEY by ``prorl sentinel stop``: another group's stop never stops this one
    group_id: str = "default"
    persist: bool = True
    down_after_ms: int = 5000
    failover_timeout_ms: int = 10000
    outlive_term: bool = False
    server: ManagedProcess | None = None
    sentinel: ManagedProcess | None = None
    held_back: bool = False
    dead_since: float | None = None
    #: the server's role and its primary when last seen alive (for a restart no sentinel answers)
    last_role: str | None = None
    last_primary: tuple[str, int] | None = None
    data_name: str | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    _lock_file: IO[str] | None = None
    _starts: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.slot not in SLOTS:
            raise ValueError(f"slot must be one of {sorted(SLOTS)}, not {self.slot}")
        self.primary_host = socket.gethostbyname(self.primary_host)
        self.primary_port = self.primary_port or self.port
        self.sentinels = [(socket.gethostbyname(host), port) for host, port in self.sentinels]
        if len(self.sentinels) != SENTINELS:
            raise ValueError(f"a group has {SENTINELS} sentinels, not {len(self.sentinels)}")

    @property
    def me(self) -> tuple[str, int]:
        return (self.address, self.port)

    @property
    def wait_s(self) -> float:
        return (self.down_after_ms + self.failover_timeout_ms) / 1000

    # -- starting ------------------------------------------------------------------------------
    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        role, with_sentinel = SLOTS[self.slot]
        if role is not None:
            self.data_name = self._data_name()
            first = (self.primary_host, cast(int, self.primary_port))
            self._start_server(replica_of=None if role == "primary" else first, held_back=False)
        if with_sentinel:
            self._write_sentinel_config()
            self._start_sentinel()

    def _data_name(self) -> str:
        """slot 0 takes the data of the group's last primary, slot 1 the other's; each is locked
        (two servers appending to one file corrupt it)."""
        marker = self.directory / PRIMARY_MARKER
        last = marker.read_text().strip() if marker.exists() else "server-1"
        name = last if self.slot == 0 else ("server-2" if last == "server-1" else "server-1")
        data = self.directory / name
        data.mkdir(exist_ok=True)
        self._lock_file = open(data / "prorl-member.lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another Redis server keeps its data in {data}: one member per slot "
                               "and directory (set PRORL_REDIS_DIR)") from None
        return name

    def _server_command(self, replica_of: tuple[str, int] | None, held_back: bool) -> list[str]:
        data = self.directory / cast(str, self.data_name)
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.persist else ["--appendonly", "no"]
        command = [self.redis_server, "-", "--port", str(self.port), "--bind", self.bind, "--dir", str(data),
                   "--save", "", *persistence, "--maxclients", "20000"]
        if replica_of is not None:
            command += ["--replicaof", replica_of[0], str(replica_of[1])]
        if held_back:
            command += ["--replica-priority", "0"]
        return command

    def _start_server(self, replica_of: tuple[str, int] | None, held_back: bool) -> None:
        if not self.persist:  # a replica's last full sync left an RDB file: start empty, not from it
            (self.directory / cast(str, self.data_name) / "dump.rdb").unlink(missing_ok=True)
        secret = _quoted(self.password or "")
        secrets = f"requirepass {secret}\nmasterauth {secret}\n" if self.password else ""
        self.server = self._spawn(f"redis-{self.slot}", self._server_command(replica_of, held_back), secrets)
        self.held_back = held_back
        self.dead_since = None

    def _write_sentinel_config(self) -> None:
        path = self.directory / f"sentinel-{self.slot}.conf"
        lines = [f"port {self.sentinel_port}", f"bind {self.bind}", f"dir {self.directory}",
                 f"sentinel monitor {self.master_name} {self.primary_host} {self.primary_port} {QUORUM}",
                 f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                 f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
                 f"sentinel parallel-syncs {self.master_name} 1"]
        if self.password:  # the sentinels' own password and the servers'
            secret = _quoted(self.password)
            lines += [f"requirepass {secret}", f"sentinel auth-pass {self.master_name} {secret}"]
        path.touch(mode=0o600)
        path.write_text("\n".join(lines) + "\n")

    def _start_sentinel(self) -> None:
        config = self.directory / f"sentinel-{self.slot}.conf"
        self.sentinel = self._spawn(f"redis-sentinel-{self.slot}", sentinel_command(self.redis_server, config))

    def _spawn(self, name: str, command: list[str], stdin: str = "") -> ManagedProcess:
        log_path = self.directory / f"{name}.log"
        self._check_not_crash_looping(name, log_path)
        deaf = self.outlive_term

        def block_term() -> None:  # the mask survives exec: Slurm's SIGTERM stays pending
            if deaf:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

        with open(log_path, "ab") as out:
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=block_term)
        assert popen.stdin is not None
        popen.stdin.write(stdin.encode())
        popen.stdin.close()
        return ManagedProcess(name, popen, log_path)

    def _check_not_crash_looping(self, name: str, log_path: Path) -> None:
        """A process that keeps exiting at once (a bad configuration, a taken port) ends the
        member with its log's last line, rather than be started again forever."""
        now = time.monotonic()
        starts = [t for t in self._starts.get(name, []) if now - t < CRASH_WINDOW_S]
        if len(starts) >= CRASH_STARTS:
            lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()] \
                if log_path.exists() else []
            raise RuntimeError(f"{name} exited {len(starts)} times within {CRASH_WINDOW_S:.0f} s; log: {log_path}"
                               + (f"\n{lines[-1]}" if lines else ""))
        self._starts[name] = [*starts, now]

    # -- what the group says -------------------------------------------------------------------
    def _sentinel(self, host: str, port: int) -> redis.Redis:
        return redis.Redis(host=host, port=port, password=self.password, socket_timeout=2,
                           socket_connect_timeout=2, decode_responses=True, **ONCE)

    def named_primary(self) -> tuple[str, int] | None:
        """The primary the first sentinel that answers names (None: none answers)."""
        for host, port in self.sentinels:
            try:
                named = cast(tuple[str, int] | None,
                             self._sentinel(host, port).sentinel_get_master_addr_by_name(self.master_name))
            except redis.RedisError:
                continue
            if named:
                return (str(named[0]), int(named[1]))
        return None

    def promotable_replica(self) -> bool:
        """Whether the sentinels know a replica they could fail over to: up, and not held back."""
        for host, port in self.sentinels:
            try:
                replicas = sentinel_replicas(self._sentinel(host, port), self.master_name)
            except redis.RedisError:
                continue
            return any(not {"s_down", "o_down", "disconnected"} & set(str(r.get("flags", "")).split(","))
                       and int(r.get("slave-priority", 0)) > 0 for r in replicas)
        return False

    def sentinels_answering(self) -> list[tuple[str, int]]:
        answering = []
        for host, port in self.sentinels:
            try:
                self._sentinel(host, port).ping()
            except redis.RedisError:
                continue
            answering.append((host, port))
        return answering

    def stop_requested(self) -> bool:
        try:
            client = Sentinel(self.sentinels, sentinel_kwargs={"password": self.password, "socket_timeout": 2, **ONCE},
                              password=self.password, socket_timeout=2, socket_connect_timeout=2, **ONCE)
            value = client.master_for(self.master_name, decode_responses=True).get(STOP_KEY)
        except redis.RedisError:
            return False
        return value == self.group_id

    # -- supervising ---------------------------------------------------------------------------
    @property
    def _local_host(self) -> str:
        """Where this host's own processes answer it."""
        return "127.0.0.1" if self.bind in ("0.0.0.0", "127.0.0.1") else self.bind

    def _own(self) -> redis.Redis:
        return redis.Redis(host=self._local_host, port=self.port, password=self.password, socket_timeout=2,
                           decode_responses=True, **ONCE)

    def _observe(self) -> None:
        """Note the live server's role; release it once in sync; name its data the primary's."""
        try:
            info = self._own().info("replication")
        except redis.RedisError:
            return
        self.last_role = info.get("role")
        if self.last_role == "slave":
            self.last_primary = (str(info.get("master_host")), int(info.get("master_port", self.port)))
            synced = info.get("master_link_status") == "up" and not int(info.get("master_sync_in_progress", 1))
            if self.held_back and synced:
                try:
                    self._own().config_set("replica-priority", PROMOTABLE_PRIORITY)
                except redis.RedisError:
                    return
                self.held_back = False
                log.info("redis-%d is in sync with its primary: it can be failed over to again", self.slot)
        elif self.last_role == "master" and self.persist and self.data_name:
            marker = self.directory / PRIMARY_MARKER
            if not marker.exists() or marker.read_text().strip() != self.data_name:
                marker.write_text(self.data_name + "\n")

    def step(self) -> None:
        """One look at this host's processes (``run`` calls it every POLL_S)."""
        if self.sentinel is not None and self.sentinel.popen.poll() is not None:
            log.warning("redis-sentinel-%d exited (%s); starting it again", self.slot, self.sentinel.popen.returncode)
            self._start_sentinel()
        if self.server is None:
            return
        if self.server.popen.poll() is None:
            self._observe()
            return
        now = time.monotonic()
        if self.dead_since is None:
            self.dead_since = now
            log.warning("redis-%d exited (%s)", self.slot, self.server.popen.returncode)
        named = self.named_primary()
        waited = now - self.dead_since
        if named is not None and named != self.me:
            log.warning("redis-%d starts again as the replica of %s:%d, held back until in sync", self.slot, *named)
            self._start_server(replica_of=named, held_back=True)
        elif named == self.me or (named is None and self.last_role == "master"):
            stranded = named is not None and not self.promotable_replica()
            if stranded or waited > self.wait_s:
                why = "no replica can take over" if stranded else f"no failover within {self.wait_s:.0f} s"
                log.warning("primary redis-%d exited and %s: starting it again in place", self.slot, why)
                self._start_server(replica_of=None, held_back=False)
        elif self.last_primary is not None:  # no sentinel answers: back as the replica it was
            self._start_server(replica_of=self.last_primary, held_back=True)

    def run(self) -> None:
        if self.outlive_term:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, signal.SIG_IGN)
        else:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, lambda *_: self.stopping.set())
        try:
            self.start()
            checked = 0.0
            while not self.stopping.is_set():
                self.step()
                if time.monotonic() - checked > 1.0:
                    checked = time.monotonic()
                    if self.stop_requested():
                        log.info("the group %s is stopping", self.group_id)
                        break
                self.stopping.wait(POLL_S)
        finally:
            self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """The sentinel first (a primary stopping under its eyes would be failed over); a
        primary after its replicas have gone, so that nothing it acknowledged is left behind."""
        if self.sentinel is not None and self.sentinel.popen.poll() is None:
            try:  # SHUTDOWN, not SIGTERM: under --outlive-term that is blocked
                self._sentinel(self._local_host, self.sentinel_port).shutdown()
            except redis.RedisError:
                pass
            self.sentinel.wait_or_kill(grace_s)
        if self.server is not None and self.server.popen.poll() is None:
            # every member runs a sentinel and stops it first: none answering means every
            # member has read the stop, and no failover can start while the servers go
            deadline = time.monotonic() + 2 * grace_s
            while self.sentinels_answering() and time.monotonic() < deadline:
                time.sleep(0.2)
            self._observe()
            if self.last_role == "master":
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    try:
                        if not int(self._own().info("replication").get("connected_slaves", 0)):
                            break
                    except redis.RedisError:
                        break
                    time.sleep(0.2)
            try:  # SHUTDOWN fsyncs the append-only file; SIGTERM would be blocked
                self._own().shutdown(nosave=not self.persist)
            except redis.RedisError:
                pass
            self.server.wait_or_kill(grace_s)


def request_stop(url: str, group_id: str, *, master_name: str, sentinel_password: str | None) -> None:
    """Tell every member of the group behind ``url`` to stop (``STOP_KEY`` in database 0, kept
    10 minutes: a later group on the same data has another id)."""
    from prorl_celery.state.connection import parse_sentinel_url

    where = parse_sentinel_url(url)
    group = Sentinel(list(where.sentinels), sentinel_kwargs={"password": sentinel_password, "socket_timeout": 5},
                     password=where.password, socket_timeout=5, socket_connect_timeout=5)
    group.master_for(master_name, db=0).set(STOP_KEY, group_id, ex=600)


def wait_stopped(url: str, timeout_s: float, *, sentinel_password: str | None) -> None:
    """Until no sentinel behind ``url`` answers (each member stops its own first)."""
    from prorl_celery.state.connection import parse_sentinel_url

    sentinels = parse_sentinel_url(url).sentinels

    def answers(host: str, port: int) -> bool:
        try:
            return bool(redis.Redis(host=host, port=port, password=sentinel_password, socket_timeout=2,
                                    socket_connect_timeout=2, **ONCE).ping())
        except redis.RedisError:
            return False

    wait_until(lambda: not any(answers(host, port) for host, port in sentinels), timeout_s,
               "the group's members stopping (a sentinel still answers)")


def wait_for_group(url: str, replicas: int, timeout_s: float, *, master_name: str,
                   sentinel_password: str | None) -> None:
    """Until the primary behind ``url`` answers, ``replicas`` replicas are in sync with it, and
    every sentinel knows them and the other sentinels (a failover needs a quorum that has met)."""
    from prorl_celery.state.connection import open_redis, parse_sentinel_url

    sentinels = [redis.Redis(host=host, port=port, password=sentinel_password, socket_timeout=3,
                             socket_connect_timeout=3, decode_responses=True)
                 for host, port in parse_sentinel_url(url).sentinels]

    def sentinels_met() -> bool:
        for sentinel in sentinels:
            state = cast(dict[str, Any], sentinel.sentinel_master(master_name))
            if int(state["num-slaves"]) < replicas or int(state["num-other-sentinels"]) < SENTINELS - 1:
                return False
        return True

    where = url.split("@")[-1].split(";")[0]
    with open_redis(url, master_name=master_name, sentinel_password=sentinel_password,
                    socket_timeout=3, socket_connect_timeout=3) as client:
        wait_until(lambda: _online_replicas(client.info("replication")) >= replicas, timeout_s,
                   f"a Redis primary with {replicas} replica(s) in sync behind {where}")
    wait_until(sentinels_met, timeout_s, f"every sentinel behind {where} knowing the replicas and the others")


def sentinel_replicas(sentinel: redis.Redis, master_name: str) -> list[dict[str, str]]:
    """SENTINEL REPLICAS, one dict per replica (redis-py 8's ``sentinel_slaves`` answers an empty
    list on a client that decodes responses)."""
    answer = sentinel.execute_command("SENTINEL", "REPLICAS", master_name)
    return [dict(zip(r[::2], r[1::2])) if isinstance(r, list) else r for r in answer]


def _online_replicas(replication: dict[str, Any]) -> int:
    """Replicas past their first sync (``connected_slaves`` counts those still waiting for it)."""
    return sum(1 for key, value in replication.items()
               if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online")


def _quoted(value: str) -> str:
    """``value`` as one argument of a Redis configuration line (a password may hold spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{text!r} is not HOST:PORT")
    return host, int(port)


@click.group()
def sentinel() -> None:
    """A Redis Sentinel group across hosts (deploy/slurm/prorl.sbatch, PRORL_REDIS_REPLICATION=sentinel)."""


@sentinel.command("member")
@click.option("--slot", type=click.IntRange(0, 2), required=True,
              help="0: the first primary and a sentinel; 1: the replica and a sentinel; 2: a sentinel")
@click.option("--primary-host", required=True, help="slot 0's host: the primary the group starts with")
@click.option("--sentinel", "sentinels", multiple=True, required=True, metavar="HOST:PORT",
              help="every sentinel of the group (three), this host's included")
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True,
              help="the group's directory, on a filesystem its hosts share (PRORL_REDIS_DIR)")
@click.option("--port", type=int, default=6379, show_default=True, help="the server's port")
@click.option("--primary-port", type=int, default=None, help="the first primary's port [default: --port]")
@click.option("--sentinel-port", type=int, default=26379, show_default=True)
@click.option("--bind", default="0.0.0.0", show_default=True)
@click.option("--address", default=None, help="this host's address as the others reach it "
              "[default: its hostname, resolved]")
@click.option("--group-id", default="default", show_default=True, help="the id `prorl sentinel stop` names")
@click.option("--persistence", type=click.Choice(["aof", "none"]), default="aof", show_default=True)
@click.option("--down-after-ms", type=int, default=5000, show_default=True)
@click.option("--failover-timeout-ms", type=int, default=10000, show_default=True)
@click.option("--outlive-term", is_flag=True, help="ignore SIGTERM and SIGINT (Slurm's end); "
              "only `prorl sentinel stop` ends the member")
def member_command(slot: int, primary_host: str, sentinels: tuple[str, ...], directory: Path, port: int,
                   primary_port: int | None, sentinel_port: int, bind: str, address: str | None, group_id: str,
                   persistence: str, down_after_ms: int, failover_timeout_ms: int, outlive_term: bool) -> None:
    """Run this host's slot of the group, and supervise it. The password is PRORL_REDIS_PASSWORD
    (the servers' and the sentinels'), never a command-line argument."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    binary = redis_server_binary()
    if binary is None:
        raise click.ClickException("redis-server not found: apt-get install redis-server redis-sentinel")
    member = Member(binary, directory, slot, primary_host, [_address(s) for s in sentinels],
                    address or socket.gethostbyname(socket.gethostname()), port=port, primary_port=primary_port,
                    sentinel_port=sentinel_port,
                    bind=bind, password=os.environ.get("PRORL_REDIS_PASSWORD") or None, group_id=group_id,
                    persist=persistence == "aof", down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms, outlive_term=outlive_term)
    member.run()


def _settings() -> Any:
    from prorl_celery.core.settings import get_settings
    settings = get_settings()
    from prorl_celery.state.connection import is_sentinel
    if not is_sentinel(settings.redis_url):
        raise click.ClickException(f"PRORL_REDIS_URL is not a sentinel:// URL ({settings.redis_url.split('@')[-1]}): "
                                   "set it to the group's sentinels")
    return settings


@sentinel.command("wait")
@click.option("--timeout", "timeout_s", type=float, default=120, show_default=True)
def wait_command(timeout_s: float) -> None:
    """Until the group behind PRORL_REDIS_URL has a primary and PRORL_REDIS_WAIT_REPLICAS replicas."""
    settings = _settings()
    wait_for_group(settings.redis_url, settings.redis_wait_replicas, timeout_s,
                   master_name=settings.redis_sentinel_master, sentinel_password=settings.redis_sentinel_password)


@sentinel.command("stop")
@click.option("--group-id", default="default", show_default=True)
@click.option("--wait", "wait_s", type=float, default=30, show_default=True,
              help="seconds to wait for the sentinels to stop (0: do not wait)")
def stop_command(group_id: str, wait_s: float) -> None:
    """Stop every member of the group behind PRORL_REDIS_URL that runs under ``group_id``."""
    settings = _settings()
    request_stop(settings.redis_url, group_id, master_name=settings.redis_sentinel_master,
                 sentinel_password=settings.redis_sentinel_password)
    if wait_s > 0:
        wait_stopped(settings.redis_url, wait_s, sentinel_password=settings.redis_sentinel_password)
