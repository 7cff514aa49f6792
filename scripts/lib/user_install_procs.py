"""The processes of one run of scripts/user_install_check.sh, found through /proc (stdlib only:
the shell's trap runs it with the base python when the venv's is gone or broken).

A process of the run carries ``PRORL_USER_CHECK_RUN=<run id>`` in its environment (the driver
sets it, every child inherits it). Sandboxes do not (bubblewrap gets a clean environment), but
they are descendants of the workers: they are found as descendants of marked processes.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

MARKER = "PRORL_USER_CHECK_RUN"


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks after boot: a pid reused by another process has another start
    name: str

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.start and stat[3] != "Z"


def _stat(pid: int) -> tuple[str, int, int, str] | None:
    """(name, ppid, start time, state) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, int(fields[1]), int(fields[19]), fields[0]


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _marked(pid: int, run_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{MARKER}={run_id}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


def processes(run_id: str | None, roots: tuple[int, ...] = ()) -> list[Proc]:
    """Every live process marked with ``run_id`` (None: none is) or among ``roots``, and all
    their descendants (the sandboxes), except this process and its ancestors."""
    table = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    spared, pid = set(), os.getpid()
    while pid in table and pid not in spared:
        spared.add(pid)
        pid = table[pid][1]
    found: set[int] = set()
    todo = [pid for pid in table if pid in roots or (run_id is not None and _marked(pid, run_id))]
    while todo:
        pid = todo.pop()
        if pid not in found and pid not in spared:
            found.add(pid)
            todo += children.get(pid, [])
    return [Proc(pid, table[pid][2], table[pid][0]) for pid in sorted(found) if table[pid][3] != "Z"]


def stop(procs: list[Proc], grace_s: float = 10.0) -> list[Proc]:
    """SIGTERM, then SIGKILL after ``grace_s``, to each of ``procs`` that is still the same
    process; returns those that were still alive when it started."""
    alive = [p for p in procs if p.alive()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in alive:
            if proc.alive():
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.alive() for p in alive):
            time.sleep(0.1)
    return alive


def describe(procs: list[Proc]) -> str:
    return ", ".join(f"{p.name}[{p.pid}]" for p in procs)


def sweep(run_id: str, sandbox_dir: str | None = None) -> int:
    """The trap's last step: stop whatever of the run is left; 1 when something was."""
    left = stop(processes(run_id))
    status = 0
    if left:
        print(f"[user_install_check] stopped what the run left behind: {describe(left)}", flush=True)
        status = 1
    if sandbox_dir and (entries := sandbox_leftovers(sandbox_dir)):
        print(f"[user_install_check] sandbox state left in {sandbox_dir}: {entries[:10]}", flush=True)
        status = 1
    return status


def sandbox_leftovers(sandbox_dir: str) -> list[str]:
    """What is left inside the runtime's directories (``state/``, ``workspaces/``, which stay,
    empty, once every sandbox is torn down) of ``PRORL_SANDBOX_DIR``."""
    if not os.path.isdir(sandbox_dir):
        return []
    left = []
    for top in sorted(os.listdir(sandbox_dir)):
        path = os.path.join(sandbox_dir, top)
        left += [os.path.join(top, entry) for entry in sorted(os.listdir(path))] if os.path.isdir(path) else [top]
    return left


if __name__ == "__main__":  # the shell's trap: user_install_procs.py RUN_ID SANDBOX_DIR
    sys.exit(sweep(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
