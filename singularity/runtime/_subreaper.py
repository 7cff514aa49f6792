"""Supervisor of a :class:`~singularity.runtime.process.ProcessRuntime` sandbox (run as a script).

``python -I -S _subreaper.py COMMAND...``: becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``)
and runs COMMAND. Whatever COMMAND starts, even a daemon that double-forks or calls setsid(),
stays a descendant of this process (orphans are re-parented here, not to init), so the runtime
finds every process of the "sandbox" through parent links in /proc. It reaps every child, exits
when none is left with COMMAND's exit status, and passes SIGTERM/SIGINT on to COMMAND.
Standard library only; imports nothing from the project.
"""
import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list) -> int:
    if not argv:
        print("usage: _subreaper.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}", file=sys.stderr)
        return 1
    main_pid = os.fork()
    if main_pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: _forward(main_pid, number))
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            return status
        if pid == main_pid:
            code = os.waitstatus_to_exitcode(raw)
            status = code if code >= 0 else 128 - code


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
