"""Sandbox runtimes with injected faults, for the teardown tests."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path

from singularity.runtime import procfs
from singularity.runtime.bubblewrap import BubblewrapRuntime


class FirstStopFails(BubblewrapRuntime):
    """Bubblewrap whose first stop sends no signal and reports every member as still running
    (as when they hang in uninterruptible I/O); every later stop is the real one."""

    failed_stops = 0

    def _terminate(self, root, pidns, refs, grace_s, popen):
        if not self.failed_stops:
            self.failed_stops += 1
            return procfs.members(root, pidns, refs)
        return super()._terminate(root, pidns, refs, grace_s, popen)


STALLED_BWRAP = '''\
import os, sys
# stand-in for bwrap: finds the --info-fd in the --args memfd (read with pread: bwrap reads it
# from the shared offset), keeps the caller's pipe open but gives bwrap a full pipe instead, and
# execs the real bwrap (same pid, same session). bwrap clones its inner child, then blocks
# writing the namespace info, before it lets the child run: the child waits on its eventfd
argv = sys.argv[1:]
args = os.pread(int(argv[argv.index("--args") + 1]), 1 << 20, 0).split(b"\\0")
info = int(args[args.index(b"--info-fd") + 1])
held = os.dup(info)  # the caller's pipe stays open (no EOF): it just never gets the info
os.set_inheritable(held, True)
read, write = os.pipe()
os.set_inheritable(read, True)  # a reader stays, or bwrap would die of SIGPIPE
os.set_blocking(write, False)
try:
    while True:
        os.write(write, b"x" * 4096)
except BlockingIOError:
    pass
os.set_blocking(write, True)
os.dup2(write, info)
with open({pid_file!r}, "w") as handle:
    handle.write(str(os.getpid()))
os.execv({bwrap!r}, [{bwrap!r}, *argv])
'''


def stalled_bwrap(directory: Path) -> tuple[Path, Path]:
    """A ``bwrap`` for :class:`BubblewrapRuntime` that never reports its namespaces (as when it is
    slow to, under load), so a start stays in ``_spawn`` waiting on ``--info-fd`` with bwrap's
    inner child already cloned; returns the script and the file it writes bwrap's pid to."""
    script, pid_file = directory / "stalled-bwrap", directory / "stalled-bwrap.pid"
    bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
    script.write_text(f"#!{sys.executable} -I\n" + STALLED_BWRAP.format(pid_file=str(pid_file), bwrap=bwrap))
    script.chmod(0o755)
    return script, pid_file


def sandbox_processes(sandbox_dir: Path) -> list[str]:
    """Every live process of the sandboxes under ``sandbox_dir``, found without any record (a
    ledger entry or its local copy): bwrap, its inner child and the tool server all write to their sandbox's log,
    ``<sandbox dir>/state/<id>/server.log``, which /proc/<pid>/fd names even once it is removed
    (other test runs on this machine have their bwraps' logs elsewhere)."""
    prefix = os.path.realpath(sandbox_dir) + os.sep
    found = []
    for info in procfs.scan():
        try:
            links = [os.readlink(f"/proc/{info.pid}/fd/{fd}") for fd in (1, 2)]
            cmdline = Path(f"/proc/{info.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        except OSError:  # gone, or without that descriptor
            continue
        if info.state not in "ZX" and any(link.startswith(prefix) for link in links):
            found.append(f"{info.pid} (ppid {info.ppid}, session {info.session}) {cmdline}")
    return found


def assert_no_sandbox_process(sandbox_dir: Path) -> None:
    """No process of the sandboxes under ``sandbox_dir`` runs; any found is killed, then reported."""
    left = sandbox_processes(sandbox_dir)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, "sandbox processes survived:\n" + "\n".join(left)


def sandbox_pids(sandbox_dir: Path) -> list[int]:
    """The pids :func:`sandbox_processes` finds."""
    return [int(line.split()[0]) for line in sandbox_processes(sandbox_dir)]
