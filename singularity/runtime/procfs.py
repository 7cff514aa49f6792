"""A sandbox's processes, found and stopped through /proc, never by name.

A process is named by its pid *and* its start time (field 22 of ``/proc/<pid>/stat``, clock
ticks since boot), so a pid the kernel reused for an unrelated process is never mistaken for
ours. A sandbox's members are:

* its root process (the one the runtime spawned: ``bwrap``, ``apptainer``, the subreaper),
* every descendant of the root (found through the parent links),
* every process in the sandbox's pid namespace (by the namespace inode, when it has one), while
  one of the processes above is still in that namespace (inode numbers are reused),
* any other process recorded at start (the tool server), while it is the same process,
* every process still in the root's session that started within ``SESSION_WINDOW_S`` of the root
  (runtimes start their root with ``start_new_session``): a child the root forked during set-up
  stays there until it makes a session of its own, and when the root dies it is no longer its
  descendant (bubblewrap's inner child, killed mid-start, waits for its parent forever). Only while
  no other live process holds the root's pid, which would then be another session's leader.

``pkill -f`` would hit other users' processes on a shared node; none of this matches names.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict


class ProcessRef(BaseModel):
    """A process identity that survives pid reuse: pid plus start time (clock ticks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        """The ref of the live process ``pid`` (None when it does not exist)."""
        info = read_stat(pid)
        return None if info is None else cls(pid=pid, start_time=info.start_time)


class ProcInfo(NamedTuple):
    pid: int
    ppid: int
    state: str
    start_time: int
    session: int = 0


#: how long after the root a process of its session may have started to count as the sandbox's
SESSION_WINDOW_S = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int) -> ProcInfo | None:
    """Parsed ``/proc/<pid>/stat`` (None when the process is gone)."""
    try:  # os.open/os.read: a third cheaper than a file object, and a scan reads every process
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = raw[raw.rfind(")") + 2:].split()
    return ProcInfo(pid, int(fields[1]), fields[0], int(fields[19]), int(fields[3]))


def is_alive(ref: ProcessRef) -> bool:
    """True while ``ref`` is running (same start time, not a zombie)."""
    info = read_stat(ref.pid)
    return info is not None and info.start_time == ref.start_time and info.state not in "ZX"


def pid_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s pid namespace (None when gone or not readable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def scan() -> list[ProcInfo]:
    """Every process on the machine, as /proc shows it now."""
    infos = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := read_stat(int(name))) is not None:
            infos.append(info)
    return infos


def writing_to(path: Path) -> list[ProcInfo]:
    """The processes whose standard output or error is the file ``path``: a sandbox's, found
    by its log when no record names its root (see :func:`.stopping.untracked`)."""
    target = os.path.realpath(path)
    found = []
    for info in scan():
        for fd in (1, 2):
            try:
                if os.readlink(f"/proc/{info.pid}/fd/{fd}") == target:
                    found.append(info)
                    break
            except OSError:
                continue
    return found


#: how old a shared snapshot may be when polling (see :func:`snapshot`)
POLL_MAX_AGE_S = 0.05


class Snapshot:
    """Every process as /proc showed it when ``taken_at`` (monotonic) began, with the parent
    links and, read once on demand, each process's pid namespace."""

    def __init__(self) -> None:
        self.taken_at = time.monotonic()
        self.infos = scan()
        self.cost_s = time.monotonic() - self.taken_at
        self.by_pid = {info.pid: info for info in self.infos}
        self.children: dict[int, list[ProcInfo]] = {}
        for info in self.infos:
            self.children.setdefault(info.ppid, []).append(info)
        self._pidns: dict[int, int | None] = {}

    def pidns(self, pid: int) -> int | None:
        if pid not in self._pidns:
            self._pidns[pid] = pid_namespace(pid)
        return self._pidns[pid]


_snapshot: Snapshot | None = None
_snapshot_lock = threading.Lock()


def snapshot(newer_than: float | None = None) -> Snapshot:
    """A snapshot begun after ``newer_than`` (monotonic), shared by this process's threads;
    None: a new one.

    A scan reads every process of the machine, so stopping many sandboxes at once, each
    scanning on its own while it polls, grew quadratically (200 sandboxes took 30 s on 2
    cores); pollers share one scan per ``POLL_MAX_AGE_S`` instead.
    """
    global _snapshot
    with _snapshot_lock:  # a thread arriving during a scan waits for it rather than scanning too
        if newer_than is None or _snapshot is None or _snapshot.taken_at < newer_than:
            _snapshot = Snapshot()
        return _snapshot


def poll_age_s() -> float:
    """How old a shared snapshot may be for a poll: ``POLL_MAX_AGE_S``, or twice what the last
    scan cost, so polling never spends more than half a core on scans however many sandboxes
    stop at once."""
    last = _snapshot
    return max(POLL_MAX_AGE_S, 2 * last.cost_s) if last is not None else POLL_MAX_AGE_S


def members(root: ProcessRef | None, pidns: int | None = None,
            refs: Iterable[ProcessRef] = (), zombies: bool = False,
            newer_than: float | None = None) -> list[ProcInfo]:
    """The sandbox's processes (see the module docstring); zombies only when asked.

    ``newer_than``: a shared snapshot begun after this monotonic time will do (default: a
    fresh scan)."""
    snap = snapshot(newer_than)
    found: dict[int, ProcInfo] = {}
    for ref in [root, *refs]:
        if ref is not None and (info := snap.by_pid.get(ref.pid)) and info.start_time == ref.start_time:
            found[info.pid] = info
    if root is not None and root.pid in found:
        found.update(_descendants(snap.children, root.pid))
    holder = snap.by_pid.get(root.pid) if root is not None else None
    if root is not None and (holder is None or holder.start_time == root.start_time):
        latest = root.start_time + SESSION_WINDOW_S * _CLOCK_TICKS
        for info in snap.infos:
            if info.session == root.pid and root.start_time <= info.start_time <= latest:
                found.setdefault(info.pid, info)
    # the kernel reuses a namespace's inode number as soon as the namespace is gone, so the
    # inode names this sandbox only while a recorded process (or a descendant of the root) is
    # still in it; otherwise a stale record would match, and kill, a newer sandbox
    if pidns is not None and any(snap.pidns(pid) == pidns for pid in found):
        for info in snap.infos:
            if info.pid not in found and snap.pidns(info.pid) == pidns:
                found[info.pid] = info
    return [info for info in found.values() if zombies or info.state not in "ZX"]


def _descendants(children: dict[int, list[ProcInfo]], pid: int) -> dict[int, ProcInfo]:
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in found:
                found[child.pid] = child
                todo.append(child.pid)
    return found


def send(infos: Iterable[ProcInfo], sig: int) -> None:
    """Signal each process, re-checking its start time first (never a reused pid)."""
    for info in infos:
        now = read_stat(info.pid)
        if now is None or now.start_time != info.start_time:
            continue
        try:
            os.kill(info.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_until(done: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def terminate(root: ProcessRef | None, pidns: int | None = None, refs: Iterable[ProcessRef] = (),
              grace_s: float = 5.0, popen: subprocess.Popen | None = None,
              kill_wait_s: float = 10.0) -> list[ProcInfo]:
    """Stop a sandbox: SIGTERM, SIGKILL after ``grace_s``; return what still runs (nothing).

    * SIGTERM goes to every member but the root (a supervisor such as ``bwrap`` or the
      subreaper exits by itself once its children are gone) and the namespace init.
    * The namespace init is stopped (SIGSTOP) first, then killed: ``bwrap`` exits as soon as
      its init *reports* the command's exit, before it has reaped the init, which would leave
      the init as an orphaned zombie for the system's init to reap. A stopped init reports
      nothing; killing it makes the kernel kill everything left in the namespace, and ``bwrap``
      then reaps it before exiting. No zombie is left behind.
    * Every process seen as a member stays tracked (pid + start time) until it is gone, so one
      whose parent exited (re-parented to init) is still stopped.
    * ``popen`` (the root, when it is our child) is reaped on the way.
    """
    seen = {ref.pid: ref for ref in refs}
    signalled = [time.monotonic()]  # when we last sent a signal

    def left(final: bool = False) -> list[ProcInfo]:
        if popen is not None:
            popen.poll()  # reap our own child, or it stays a zombie
        # polls share a recent snapshot; "nothing left" counts only from one begun after our
        # last signal, so a process forked before it is never missed
        newer_than = signalled[0] if final else max(signalled[0], time.monotonic() - poll_age_s())
        infos = members(root, pidns, seen.values(), newer_than=newer_than)
        # once seen, a process stays tracked by pid + start time even if re-parented away
        seen.update((i.pid, ProcessRef(pid=i.pid, start_time=i.start_time)) for i in infos)
        return infos

    def signal_all(infos: Iterable[ProcInfo], sig: int) -> None:
        send(infos, sig)
        signalled[0] = time.monotonic()

    current = left()
    init = next((info for info in current if _is_ns_init(info, pidns)), None)
    keep = {info.pid for info in (init,) if info} | ({root.pid} if root else set())
    if init is not None:
        signal_all([init], signal.SIGSTOP)
    inner = [info for info in current if info.pid not in keep]
    signal_all(inner or ([] if init else current), signal.SIGTERM)
    if grace_s > 0:
        wait_until(lambda: not [i for i in left() if i.pid not in keep], grace_s)
    if init is not None:
        signal_all([init], signal.SIGKILL)
        wait_until(lambda: not left(), min(kill_wait_s, 2.0))

    def killed() -> bool:  # a process forked between the scan and the signal gets the next round
        rest = left(final=True)
        if rest:
            signal_all(rest, signal.SIGKILL)
        return not rest

    wait_until(killed, kill_wait_s)
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return left(final=True)


def _is_ns_init(info: ProcInfo, pidns: int | None) -> bool:
    """True when ``info`` is pid 1 of namespace ``pidns`` (the last NSpid field is 1)."""
    if pidns is None:
        return False
    try:
        with open(f"/proc/{info.pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return line.split()[-1] == "1" and pid_namespace(info.pid) == pidns
    except OSError:
        pass
    return False
