"""How ``prorl up`` owns what it starts: children that die with it, the signals that stop it, and
the record of a running cluster in its data directory.

- **Children die with their parent**, even when it is SIGKILLed: each child asks the kernel for
  SIGTERM on its parent's death (``prctl(PR_SET_PDEATHSIG)``, Linux) before it execs. SIGTERM, not
  SIGKILL, so that redis-server writes its last second of AOF and the workers hand their stages
  back. The signal follows the death of the *thread* that forked the child, so only a launcher
  that starts every child from its main thread (``prorl up``, ``prorl demo``) asks for it.
- **SIGINT, SIGTERM and SIGHUP all stop the cluster** (closing the terminal sends SIGHUP), at
  once during start-up too: the handler raises :class:`Interrupted` until the cluster is up, and
  the cluster's ``__enter__`` stops what it had started.
- **The cluster record** (``prorl-up.json`` in the data directory): the pid of ``prorl up``, its
  gateway, its redis-server's pid and the LLM server it registered. A second ``prorl up`` names
  the running one from it; ``prorl shutdown`` stops a detached one by it; the next ``prorl up``
  removes the LLM server the last one registered (gone with it).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

PR_SET_PDEATHSIG = 1
RECORD_NAME = "prorl-up.json"
#: the signals that stop ``prorl up``
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when this process dies."""
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


class Interrupted(BaseException):
    """A stop signal arrived while the cluster was still starting. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on the way (a readiness poll's) keeps
    start-up going."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP: raise :class:`Interrupted` while starting, then set ``stopped``.

    A second signal while stopping is ignored: the children are being stopped already, and die
    with this process anyway."""

    def __init__(self) -> None:
        self.started = False
        self.received: int | None = None
        for sig in STOP_SIGNALS:  # SIGINT explicitly too: a shell starts background jobs with it ignored
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            return
        self.received = signum
        if not self.started:
            raise Interrupted(signum)

    @property
    def stopped(self) -> bool:
        return self.received is not None


@dataclass
class ClusterRecord:
    pid: int
    gateway: str
    redis_pid: int | None = None
    llm_url: str | None = None
    log_dir: str | None = None

    @staticmethod
    def path(directory: Path) -> Path:
        return directory / RECORD_NAME

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        temporary = self.path(directory).with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self)))
        temporary.replace(self.path(directory))

    @classmethod
    def read(cls, directory: Path) -> ClusterRecord | None:
        try:
            fields = json.loads(cls.path(directory).read_text())
            return cls(**{name: fields.get(name) for name in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def remove(cls, directory: Path, pid: int) -> None:
        """Forget the record, if it is still ``pid``'s."""
        record = cls.read(directory)
        if record is not None and record.pid == pid:
            cls.path(directory).unlink(missing_ok=True)


def alive(pid: int | None, command: str | None = None) -> bool:
    """``pid`` is a running process (whose command line contains ``command``, when given)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie has exited
        return False
    return command is None or command in cmdline
