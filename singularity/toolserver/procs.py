"""Finding and killing the processes a shell started, through /proc (never by name)."""

from __future__ import annotations

import os
import signal


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ")"
    return raw[raw.rfind(")") + 2 :].split()


def session_members(leader: int) -> list[int]:
    """Pids whose session id or process group id is ``leader`` (the shell's pid).

    A shell on its own pty is a session leader, so everything it started (foreground commands,
    background jobs, their children) is in its session unless it called setsid() itself.
    """
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        # after the name: state ppid pgrp session ...
        if fields and len(fields) > 3 and leader in (int(fields[2]), int(fields[3])):
            members.append(int(name))
    return members


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    if not fields:
        return False
    return fields[0] not in ("Z", "X")


def kill_session(leader: int, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to the process group and every member of the session; the pids signalled."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass
    members = session_members(leader)
    for pid in members:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return members
