"""The runtime interface: start a sandbox from a typed spec, stop it, prove nothing is left.

Start and stop are separate from execution: a started sandbox runs one tool server listening on
a Unix socket in a directory bound into it, and every action goes through that socket
(:meth:`Sandbox.client`). A :class:`Sandbox` does not depend on the event loop that started it,
so INIT can start it and RUN (another task, another loop) can use and stop it.

Lifecycle shared by every runtime (:meth:`Runtime.start`, :meth:`Runtime.stop`):

1. a state directory ``<state_dir>/<sandbox id>/`` holds the socket directory and the log;
2. a loopback address is leased when the spec has none and an allocator is configured;
3. the runtime spawns its root process (``_spawn``) in the calling thread, in a session of its
   own, and hands it to ``start`` the moment it exists, before waiting on anything (bwrap's
   ``--info-fd``, say): a start cancelled or failing from then on tears down the root and what
   it forked, found by its session if the root is gone. A started sandbox outlives the process
   and thread that started it: it belongs to its job, and ends through the one teardown path
   (step 5), never by its starter's exit. (``BubblewrapRuntime(die_with_parent=True)`` is the
   exception, for a caller that wants a sandbox to die with the thread that forked it; the
   service never uses it: an INIT worker's exit would take the sandboxes of jobs it had handed
   to RUN with it);
4. the sandbox is recorded in the ownership ledger as soon as its root process exists, and
   start waits for the tool server's ``READY <socket>`` line in the log;
5. stop (and a start that fails part-way) goes through :func:`.stopping.teardown`, the one
   teardown path: SIGTERM to every member (see :mod:`.procfs`), SIGKILL after the grace period,
   a /proc check that nothing is left, then the lease, the state directory and the ledger entry
   go. A stop that leaves processes running stays in the ledger, marked for a retry, and the
   node's reaper (:func:`.stopping.reap`) retries it with a bounded backoff until it succeeds;
   the reaper also stops the sandboxes whose owner process died and that no job still holds.

In SWE-ReX's words, a :class:`Runtime` here is a *deployment* (where a sandbox lives, how it is
started and torn down) and the tool server on the sandbox's socket is the *runtime* (what runs
actions). The class keeps its name because ``PRORL_RUNTIME``, the README and the design card
use it.
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
import subprocess
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from . import procfs
from .addresses import AddressAllocator
from .errors import SandboxStartError, SandboxStartTimeout, SandboxStopError
from .ledger import SandboxLedger, SandboxRecord
from .procfs import ProcessRef, ProcInfo
from .stopping import ReapReport, teardown, write_local_record

WORKSPACE = "/workspace"
SOCKET_DIR = "/run/toolserver"
SOCKET_NAME = "tool.sock"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_SERVER_ARGV = ("{python}", "-m", "singularity.toolserver",
                       "--socket", "{socket}", "--workspace", "{workspace}")
RESERVED_TARGETS = ("/", "/proc", "/dev", "/tmp", WORKSPACE, SOCKET_DIR)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Bind(Model):
    """A host path made visible inside the sandbox (read-only unless asked)."""

    source: Path
    target: str
    read_only: bool = True

    @model_validator(mode="before")
    @classmethod
    def _from_tuple(cls, value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return dict(zip(("source", "target", "read_only"), value))
        return value

    @field_validator("target")
    @classmethod
    def _absolute(cls, target: str) -> str:
        if not target.startswith("/") or ".." in target.split("/"):
            raise ValueError(f"bind target {target!r} must be an absolute path without '..'")
        normal = os.path.normpath(target)
        if any(normal == r or normal.startswith(r.rstrip("/") + "/") and r != "/" for r in RESERVED_TARGETS):
            raise ValueError(f"bind target {target!r} is reserved by the runtime")
        return normal


class Limits(Model):
    """Resource limits; each runtime documents how it enforces them."""

    memory_bytes: PositiveInt | None = None  # RLIMIT_AS, per process
    max_processes: PositiveInt | None = None  # RLIMIT_NPROC: tasks (threads too) in the sandbox
    cpu_seconds: PositiveInt | None = None  # RLIMIT_CPU, per process
    tmp_bytes: PositiveInt | None = None  # size of the private /tmp (runtimes that mount one)


class SandboxSpec(Model):
    """What to start: one sandbox for one job."""

    image: str = Field(min_length=1)
    workspace: Path
    binds: tuple[Bind, ...] = ()
    network: bool = False
    limits: Limits = Limits()
    env: dict[str, str] = {}
    job_id: str = ""
    address: str | None = None  # a 127.x.y.z; leased from the allocator when None

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.match(name) or "\0" in value:
                raise ValueError(f"invalid environment variable {name!r}")
        return env

    @field_validator("address")
    @classmethod
    def _loopback(cls, address: str | None) -> str | None:
        if address is not None and not ipaddress.IPv4Address(address).is_loopback:
            raise ValueError(f"{address} is not a 127.x.y.z loopback address")
        return address


@dataclass(frozen=True)
class Availability:
    """Whether a runtime can run here; ``reason`` says why not (or what it found)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class Launch:
    """What ``_spawn`` started: the root process and where its tool server will listen."""

    popen: subprocess.Popen
    pidns: int | None = None
    refs: list[ProcessRef] = field(default_factory=list)


#: how ``_spawn`` hands its root process to ``start`` the moment it exists
Spawned = Callable[[subprocess.Popen], None]


@dataclass
class _Attempt:
    """What a start in progress has started so far: all the abort has to tear down."""

    popen: subprocess.Popen | None = None
    root: ProcessRef | None = None  # taken while the root is our unreaped child: never a reused pid
    launch: Launch | None = None


class Sandbox:
    """A running sandbox. Use ``async with`` (or :meth:`stop`) so it is always cleaned up."""

    def __init__(self, *, id: str, spec: SandboxSpec, runtime: Runtime, socket_path: Path,
                 address: str | None, root: ProcessRef, pidns: int | None,
                 refs: list[ProcessRef], state_dir: Path, popen: subprocess.Popen | None,
                 leased: bool) -> None:
        self.id, self.spec, self.runtime = id, spec, runtime
        self.socket_path, self.address, self.state_dir = socket_path, address, state_dir
        self.root, self.pidns, self.refs = root, pidns, refs
        self.popen, self.leased = popen, leased
        self.started_at = time.time()
        self.stopped = False

    @property
    def workspace(self) -> Path:
        return self.spec.workspace

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def pids(self) -> list[int]:
        """The host pids of every process in the sandbox right now."""
        return sorted(info.pid for info in procfs.members(self.root, self.pidns, self.refs))

    def client(self) -> Any:
        """A tool server client on this sandbox's socket."""
        from singularity.toolserver.client import ToolClient
        return ToolClient(str(self.socket_path))

    async def stop(self, grace_s: float | None = None) -> None:
        await self.runtime.stop(self, grace_s=grace_s)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.runtime.name} job={self.job_id!r} root={self.root.pid}>"


#: the root processes of the sandboxes this process spawned, until they have been waited for: a
#: sandbox often outlives the Sandbox object of the process that started it (INIT hands it to
#: RUN, which stops it), and its exit must still be collected here, or it stays a zombie
_spawned_here: set[subprocess.Popen] = set()


def reap_exited_children() -> int:
    """Wait for every sandbox root this process spawned that has exited (a worker's reaper tick
    calls this); returns how many were collected."""
    done = [popen for popen in list(_spawned_here) if popen.poll() is not None]
    _spawned_here.difference_update(done)
    return len(done)


def default_state_dir() -> Path:
    """Short on purpose: a Unix socket path must stay under 108 bytes."""
    return Path(tempfile.gettempdir()) / f"prorl-sandboxes-{os.geteuid()}"


class Runtime(ABC):
    """Starts and stops sandboxes. Subclasses implement :meth:`available` and :meth:`_spawn`."""

    name: ClassVar[str]
    #: False for runtimes without isolation: the contract suite marks isolation checks n/a.
    isolated: ClassVar[bool] = True

    def __init__(self, *, state_dir: Path | None = None, allocator: AddressAllocator | None = None,
                 ledger: SandboxLedger | None = None, node: str | None = None,
                 worker: str | None = None, server_argv: Sequence[str] | None = None,
                 ready_timeout_s: float = 60.0, stop_grace_s: float = 5.0) -> None:
        self.state_dir = Path(state_dir or default_state_dir())
        self.allocator, self.ledger = allocator, ledger
        self.node = node or socket.gethostname()
        self.worker = worker or f"{self.node}:{os.getpid()}"
        self.server_argv = tuple(server_argv or DEFAULT_SERVER_ARGV)
        self.ready_timeout_s, self.stop_grace_s = ready_timeout_s, stop_grace_s

    @abstractmethod
    def available(self) -> Availability:
        """Whether this runtime works on this machine, with the reason."""

    @abstractmethod
    async def _spawn(self, spec: SandboxSpec, sandbox_dir: Path, log: Any, spawned: Spawned) -> Launch:
        """Start the root process and pass it to ``spawned`` at once, before awaiting anything
        (the start may be cancelled there); the tool server must print ``READY <socket>`` to
        ``log``. A failure after ``spawned`` needs no clean-up here: the start's abort stops it."""

    def _after_ready(self, launch: Launch) -> None:  # noqa: B027 - optional: most runtimes need nothing more
        """Hook: learn more about the started processes (e.g. their pid namespace)."""

    def _host_socket(self, sandbox_dir: Path) -> Path:
        """The host path of the socket (runtimes that bind the socket directory use this)."""
        return sandbox_dir / "sock" / SOCKET_NAME

    def server_command(self, python: str, socket_path: str, workspace: str, *,
                       no_site: bool = False) -> list[str]:
        """The tool server's argv; ``no_site`` adds ``-S`` after the interpreter (the caller puts
        site-packages on PYTHONPATH)."""
        values = {"python": python, "socket": socket_path, "workspace": workspace}
        argv = [part.format(**values) for part in self.server_argv]
        if no_site and self.server_argv[:1] == ("{python}",):
            argv.insert(1, "-S")
        return argv

    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox and return once its tool server listens.

        The ledger entry is written as soon as the root process exists (and again with the
        tool server's pid once it is ready), so a worker that dies mid-start leaves a record
        for :func:`~.stopping.reap`, not an untracked sandbox.
        """
        sandbox_id = uuid.uuid4().hex[:12]
        sandbox_dir = self.state_dir / sandbox_id
        (sandbox_dir / "sock").mkdir(parents=True, mode=0o755)
        spec.workspace.mkdir(parents=True, exist_ok=True)
        leased = spec.address is None and self.allocator is not None
        if leased and self.allocator is not None:
            spec = spec.model_copy(update={"address": self.allocator.allocate(sandbox_id)})
        attempt = _Attempt()
        # before the fork: a worker killed while forking leaves a root that no record names yet;
        # this one lets the untracked reaper find it by its log (stopping.untracked)
        write_local_record(self._attempt_record(attempt, spec, sandbox_dir, leased, sandbox_id))

        def spawned(popen: subprocess.Popen) -> None:
            attempt.popen, attempt.root = popen, _ref(popen.pid)
            _spawned_here.add(popen)
            record = self._attempt_record(attempt, spec, sandbox_dir, leased, sandbox_id)
            write_local_record(record)
            if self.ledger is not None:  # a worker dying from here on leaves a record to reap
                self.ledger.record(record)

        try:
            with open(sandbox_dir / "server.log", "wb") as log:
                attempt.launch = launch = await self._spawn(spec, sandbox_dir, log, spawned)
            sandbox = self._sandbox(sandbox_id, spec, attempt, sandbox_dir, leased)
            await self._wait_ready(launch, sandbox_dir)
            self._after_ready(launch)
            sandbox.pidns, sandbox.refs = launch.pidns, launch.refs
            self._write_ledger(sandbox)
            return sandbox
        except SandboxStartError as exc:
            tail = _tail(sandbox_dir / "server.log")
            self._abort(attempt, spec, sandbox_dir, leased, sandbox_id)
            if "log:" in exc.message:
                raise
            raise type(exc)(f"{exc.message}; log:\n{tail}") from exc
        except BaseException:
            self._abort(attempt, spec, sandbox_dir, leased, sandbox_id)
            raise

    def _sandbox(self, sandbox_id: str, spec: SandboxSpec, attempt: _Attempt, sandbox_dir: Path,
                 leased: bool) -> Sandbox:
        launch = attempt.launch
        assert launch is not None and attempt.root is not None, "_spawn returned without spawned()"
        sandbox = Sandbox(id=sandbox_id, spec=spec, runtime=self,
                          socket_path=self._host_socket(sandbox_dir), address=spec.address,
                          root=attempt.root, pidns=launch.pidns, refs=launch.refs,
                          state_dir=sandbox_dir, popen=launch.popen, leased=leased)
        self._write_ledger(sandbox)
        return sandbox

    def _write_ledger(self, sandbox: Sandbox) -> None:
        record = self._record(sandbox)
        write_local_record(record)
        if self.ledger is not None:
            self.ledger.record(record)

    async def stop(self, sandbox: Sandbox, grace_s: float | None = None) -> None:
        """SIGTERM everything, SIGKILL after ``grace_s``; raise if /proc still shows a member.

        A failed stop stays in the ledger and the reaper retries it; calling stop again also
        retries."""
        if sandbox.stopped:
            return
        # the ledger's entry, not one made afresh: RUN may have adopted it, a failed stop counted
        record = (self.ledger.get(self.node, sandbox.id) if self.ledger is not None else None) \
            or self._record(sandbox)
        report = await asyncio.to_thread(self.teardown, record, grace_s=grace_s, popen=sandbox.popen)
        if report.left:
            retry = "; the reaper retries it" if self.ledger is not None else ""
            raise SandboxStopError(f"sandbox {sandbox.id}: pids {report.left} survived SIGKILL{retry}")
        sandbox.stopped = True

    def teardown(self, record: SandboxRecord, *, grace_s: float | None = None,
                 popen: subprocess.Popen | None = None) -> ReapReport:
        """Stop a sandbox from its ledger entry, from any process of this node (blocking): the
        one teardown path (:func:`.stopping.teardown`) with this runtime's ledger, allocator
        and :meth:`_terminate`."""
        grace = self.stop_grace_s if grace_s is None else grace_s
        return teardown(record, ledger=self.ledger, allocator=self.allocator, grace_s=grace,
                        popen=popen, terminate=self._terminate)

    def _terminate(self, root: ProcessRef | None, pidns: int | None, refs: Iterable[ProcessRef],
                   grace_s: float, popen: subprocess.Popen | None) -> list[ProcInfo]:
        """Hook: stop a sandbox's members, return what still runs. Every runtime's sandboxes
        are found and stopped through /proc (:func:`.procfs.terminate`); a runtime with a
        stop of its own (an instance manager) would override this."""
        return procfs.terminate(root, pidns, refs, grace_s, popen)

    async def _wait_ready(self, launch: Launch, sandbox_dir: Path) -> None:
        log_path = sandbox_dir / "server.log"
        deadline = time.monotonic() + self.ready_timeout_s
        delay = 0.001
        while True:
            if _ready_line(log_path):
                return
            if launch.popen.poll() is not None:
                raise SandboxStartError(f"{self.name}: exited with {launch.popen.returncode} before "
                                        f"READY; log:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise SandboxStartTimeout(f"{self.name}: no READY line within "
                                          f"{self.ready_timeout_s} s; log:\n{_tail(log_path)}")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.003)  # a small file: polling it is cheap, and prompt

    def _abort(self, attempt: _Attempt, spec: SandboxSpec, sandbox_dir: Path, leased: bool,
               sandbox_id: str) -> None:
        """A start failed or was cancelled: tear down whatever it got to, the same way a stop
        does. From the moment the root exists, even before ``_spawn`` returned (bwrap not yet
        past its set-up): its session still names a child it forked, once it is gone."""
        record = self._attempt_record(attempt, spec, sandbox_dir, leased, sandbox_id)
        # before _spawn returned no command runs yet, nothing to stop gently: bwrap's inner child,
        # its namespace's init, ignores SIGTERM anyway, and a /stop waits on these aborts
        grace = 0.5 if attempt.launch is not None else 0.0
        self.teardown(record, grace_s=grace, popen=attempt.popen)

    def _attempt_record(self, attempt: _Attempt, spec: SandboxSpec, sandbox_dir: Path, leased: bool,
                        sandbox_id: str) -> SandboxRecord:
        launch = attempt.launch
        return SandboxRecord(
            sandbox_id=sandbox_id, node=self.node, job_id=spec.job_id, worker=self.worker,
            owner=_ref(os.getpid()), runtime=self.name, root=attempt.root,
            pidns=launch.pidns if launch is not None else None,
            refs=launch.refs if launch is not None else [],
            address=spec.address if leased else None, state_dir=str(sandbox_dir),
            workspace=str(spec.workspace), started_at=time.time())

    def _record(self, sandbox: Sandbox) -> SandboxRecord:
        return SandboxRecord(
            sandbox_id=sandbox.id, node=self.node, job_id=sandbox.job_id, worker=self.worker,
            owner=_ref(os.getpid()), runtime=self.name, root=sandbox.root, pidns=sandbox.pidns,
            refs=sandbox.refs, address=sandbox.address if sandbox.leased else None,
            socket_path=str(sandbox.socket_path), state_dir=str(sandbox.state_dir),
            workspace=str(sandbox.workspace), started_at=sandbox.started_at)


def sandbox_env(spec: SandboxSpec, *, path: str = DEFAULT_PATH, home: str = "/tmp",
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment inside: PATH, HOME, LANG, the runtime's extras, then the spec's."""
    env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8"}
    if spec.address:
        env["PRORL_SANDBOX_ADDRESS"] = spec.address
    env.update(extra or {})
    env.update(spec.env)
    return env


def limit_prefix(limits: Limits, prlimit: str = "prlimit") -> list[str]:
    """``prlimit`` arguments that set the spec's rlimits (soft = hard) before exec."""
    options = [(limits.max_processes, "--nproc"), (limits.memory_bytes, "--as"),
               (limits.cpu_seconds, "--cpu")]
    args = [f"{flag}={value}:{value}" for value, flag in options if value is not None]
    return [prlimit, *args, "--"] if args else []


def _ref(pid: int) -> ProcessRef:
    ref = ProcessRef.of(pid)
    return ref if ref is not None else ProcessRef(pid=pid, start_time=-1)


def _ready_line(log_path: Path) -> bool:
    try:
        with open(log_path, "rb") as handle:
            return any(line.startswith(b"READY ") for line in handle)
    except OSError:
        return False


def _tail(log_path: Path, size: int = 4000) -> str:
    try:
        return log_path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return "(no log)"
