"""A sandbox's processes, found and stopped through /proc, never by name.

A process is named by its pid *and* its start time (field 22 of ``/proc/<pid>/stat``, clock
ticks since boot), so a pid the kernel reused for an unrelated process is never mistaken for
ours. A sandbox's members are:

* its root process (the one the runtime spawned: ``bwrap``, ``apptainer``, the subreaper),
* every descendant of the root (found through the parent links),
* every process in the sandbox's pid namespace (by the namespace inode, when it has one), while
  one of the processes above is still in that namespace (inode numbers are reused),
* any other process recorded at start (the tool server), while it is the same process.

``pkill -f`` would hit other users' processes on a shared node; none of this matches names.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
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


def read_stat(pid: int) -> ProcInfo | None:
    """Parsed ``/proc/<pid>/stat`` (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = raw[raw.rfind(")") + 2:].split()
    return ProcInfo(pid, int(fields[1]), fields[0], int(fields[19]))


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


def members(root: ProcessRef | None, pidns: int | None = None,
            refs: Iterable[ProcessRef] = (), zombies: bool = False) -> list[ProcInfo]:
    """The sandbox's processes (see the module docstring); zombies only when asked."""
    infos = scan()
    by_pid = {info.pid: info for info in infos}
    found: dict[int, ProcInfo] = {}
    for ref in [root, *refs]:
        if ref is not None and (info := by_pid.get(ref.pid)) and info.start_time == ref.start_time:
            found[info.pid] = info
    if root is not None and root.pid in found:
        found.update(_descendants(infos, root.pid))
    # the kernel reuses a namespace's inode number as soon as the namespace is gone, so the
    # inode names this sandbox only while a recorded process (or a descendant of the root) is
    # still in it; otherwise a stale record would match, and kill, a newer sandbox
    if pidns is not None and any(pid_namespace(pid) == pidns for pid in found):
        for info in infos:
            if info.pid not in found and pid_namespace(info.pid) == pidns:
                found[info.pid] = info
    return [info for info in found.values() if zombies or info.state not in "ZX"]


def _descendants(infos: list[ProcInfo], pid: int) -> dict[int, ProcInfo]:
    children: dict[int, list[ProcInfo]] = {}
    for info in infos:
        children.setdefault(info.ppid, []).append(info)
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

    def left() -> list[ProcInfo]:
        if popen is not None:
            popen.poll()  # reap our own child, or it stays a zombie
        infos = members(root, pidns, seen.values())
        # once seen, a process stays tracked by pid + start time even if re-parented away
        seen.update((i.pid, ProcessRef(pid=i.pid, start_time=i.start_time)) for i in infos)
        return infos

    current = left()
    init = next((info for info in current if _is_ns_init(info, pidns)), None)
    keep = {info.pid for info in (init,) if info} | ({root.pid} if root else set())
    if init is not None:
        send([init], signal.SIGSTOP)
    inner = [info for info in current if info.pid not in keep]
    send(inner or ([] if init else current), signal.SIGTERM)
    if grace_s > 0:
        wait_until(lambda: not [i for i in left() if i.pid not in keep], grace_s)
    if init is not None:
        send([init], signal.SIGKILL)
        wait_until(lambda: not left(), min(kill_wait_s, 2.0))

    def killed() -> bool:  # a process forked between the scan and the signal gets the next round
        rest = left()
        send(rest, signal.SIGKILL)
        return not rest

    wait_until(killed, kill_wait_s)
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return left()


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
