"""The ``bash`` tool: one persistent interactive shell over a pty.

How a command runs:

* the shell is ``bash --noprofile --norc --noediting -i`` on a pty (ptyprocess), with tty echo
  off (so the command is never echoed back), no output post-processing (``\\n`` stays ``\\n``),
  job control off (``set +m``: every command stays in the shell's process group and session,
  so killing the group kills everything; background jobs ignore Ctrl-C), ``PS1=''``,
  ``PS2=''``, ``TERM=dumb``, ``PAGER=cat`` and friends;
* the command goes to the shell as one typed line, ``eval $'...'``, its bytes quoted as
  printable ASCII with ``\\xHH`` escapes (so no control character reaches the tty's line
  discipline): multi-line commands, heredocs and unbalanced quotes (a syntax error with status
  2, not a hang waiting for more input) all work, and the shell state (cwd, variables,
  functions) persists because ``eval`` runs in the shell itself. Commands too long for the pty's
  4 KiB line buffer are written to a private script file and run with ``source <file>``;
* history expansion is off (``set +H``), so ``!`` is an ordinary character; as in a terminal,
  ``cmd &`` prints ``[1] <pid>`` (on stderr, which shares the pty);
* after the command the shell prints its prompt, and ``PROMPT_COMMAND`` (read-only) prints the
  sentinel ``\\n__TS_<nonce>_<exit code>__\\n`` first: the output is everything before it;
* on timeout the tool writes Ctrl-C (``\\x03``) to the pty: the line discipline sends SIGINT to
  the foreground process group (the shell and its foreground command; background jobs ignore
  it), which stops ``sleep``, ``read``, ``python3 -c 'input()'`` and the like, and the next
  prompt carries the exit code (130). If no prompt comes within the grace period (a command that
  ignores SIGINT) the whole session is killed and a new shell started: ``shell_restarted`` says
  the state was lost;
* output is kept bounded while it streams: the first and last halves of ``max_output`` bytes,
  with a note in the middle saying how many bytes were dropped;
* output written by background jobs between two commands is prepended to the next command's.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import shlex
import signal
import termios
from pathlib import Path
from typing import TYPE_CHECKING

from .capture import Capture
from .procs import kill_session
from .protocol import BashArgs, BashResult

if TYPE_CHECKING:
    from ptyprocess import PtyProcess  # imported when the first shell starts

SHELL = "/bin/bash"
DIMENSIONS = (40, 200)
PR_SET_PDEATHSIG = 1
MAX_TYPED_LINE = 3000  # the pty's canonical line buffer holds 4095 bytes
QUIET_ENV = {
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "cat",
    "LESS": "-FRX",
    "NO_COLOR": "1",
    "PS1": "",
    "PS2": "",
    "PS4": "+ ",
    "HISTFILE": "/dev/null",
}
DROP_ENV = ("BASH_ENV", "ENV", "PS0", "PROMPT_COMMAND", "CDPATH")


class BashSession:
    """The persistent shell behind the ``bash`` tool; commands run one at a time."""

    def __init__(
        self,
        *,
        workspace: Path,
        run_dir: Path,
        max_output: int,
        shell: str = SHELL,
        interrupt_grace_s: float = 2.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workspace, self.max_output, self.shell = workspace, max_output, shell
        self.interrupt_grace_s = interrupt_grace_s
        self._base_env = dict(os.environ if env is None else env)
        nonce = os.urandom(6).hex()  # not `secrets`: its hashlib import costs start-up time
        self._prompt_command = f'printf "\\n__TS_{nonce}_%s__\\n" "$?"'
        self._sentinel = re.compile(rb"\r?\n__TS_" + nonce.encode() + rb"_(\d+)__\r?\n")
        self._script = run_dir / "bash-command.sh"
        self._source_line = f"source {shlex.quote(str(self._script))}\n".encode()
        self._lock = asyncio.Lock()
        self._proc: PtyProcess | None = None
        self._pidfd: int | None = None
        self._capture: Capture | None = None
        self._pending = bytearray()  # background output between commands
        self._exited = asyncio.Event()
        self._ever_started = False
        self.exit_status: int | None = None  # of the last shell that ended

    @property
    def _shell_proc(self) -> PtyProcess:
        """The spawned shell, for the code that runs only while there is one."""
        assert self._proc is not None, "no shell spawned"
        return self._proc

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._exited.is_set()

    async def start(self) -> None:
        """Spawn the shell and wait until it has printed its first prompt."""
        self._spawn()
        await self._wait_prompt(10.0)  # the initial prompt
        self._type(b"set +m +H; readonly PROMPT_COMMAND\n")
        await self._wait_prompt(10.0)

    async def ensure_started(self) -> None:
        """Start the shell now unless it runs (the server does this right after READY)."""
        async with self._lock:
            if not self.alive:
                await self.start()

    async def run(self, args: BashArgs) -> BashResult:
        async with self._lock:
            restarted = self._ever_started and not self.alive
            if not self.alive:
                await self.start()
            return await self._run(args.command, args.timeout_s, restarted)

    async def close(self) -> None:
        """Kill the shell and everything it started (its whole session)."""
        if self.alive:
            await self._kill()
        self._release()

    def kill_now(self) -> None:
        """Synchronous last resort (no event loop): SIGKILL the session and reap the shell."""
        if self._proc is not None and not self._exited.is_set():
            kill_session(self._proc.pid)
            try:
                os.waitpid(self._proc.pid, 0)
            except ChildProcessError:
                pass

    # -- running one command ---------------------------------------------------------------------

    async def _run(self, command: str, timeout_s: float, restarted: bool) -> BashResult:
        capture = self._new_capture()
        if not self._type(self._command_line(command)):
            capture.finish()  # the shell is gone; _on_exit reports its status
        timed_out = not await capture.wait(timeout_s)
        if timed_out:
            restarted = not await self._interrupt(capture) or restarted
        self._capture = None
        self._pending += capture.leftover[-self.max_output :]
        output, truncated = capture.output()
        output = output.replace(f"{self._script}: ", "")  # "bash: line 1: ..." for syntax errors
        exit_code = capture.exit_code
        if capture.exit_code is None and not timed_out:  # the shell itself ended (``exit 3``)
            exit_code, restarted = self.exit_status, True
            output += f"\n[the shell exited with status {exit_code}; a new shell will be started]"
        elif capture.exit_code is None:
            output += "\n[the command ignored Ctrl-C: the shell was killed and its state lost]"
        return BashResult(
            output=output,
            exit_code=exit_code,
            timed_out=timed_out,
            truncated=truncated,
            shell_restarted=restarted,
        )

    def _command_line(self, command: str) -> bytes:
        """``eval $'...'`` (one printable line), or ``source <file>`` for long commands."""
        quoted = ansi_c_quote(command)
        if len(quoted) <= MAX_TYPED_LINE:
            return b"eval " + quoted + b"\n"
        self._script.write_text(command + "\n")
        return self._source_line

    def _type(self, data: bytes) -> bool:
        """Write to the pty (lines are short: the loop only covers a full tty buffer)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._shell_proc.fd, view) :]
            except BlockingIOError:
                select.select([], [self._shell_proc.fd], [], 1.0)
            except OSError:  # EIO: the shell is gone
                return False
        return True

    def _new_capture(self) -> Capture:
        capture = Capture(self.max_output, self._sentinel)
        if self._pending:
            capture.feed(bytes(self._pending))
            self._pending.clear()
        self._capture = capture
        return capture

    async def _interrupt(self, capture: Capture) -> bool:
        """Ctrl-C (twice if need be); False when the shell had to be killed."""
        for _ in range(2):
            if not self.alive:
                return False
            self._type(b"\x03")
            if await capture.wait(self.interrupt_grace_s / 2):
                return capture.exit_code is not None
        await self._kill()
        return False

    async def _wait_prompt(self, timeout_s: float) -> None:
        capture = Capture(64 * 1024, self._sentinel)
        self._capture = capture
        try:
            await capture.wait(timeout_s)
        finally:
            self._capture = None
        if capture.exit_code is None:
            raise RuntimeError(f"the shell did not start: {capture.output()[0]!r}")

    # -- the process -----------------------------------------------------------------------------

    def _spawn(self) -> None:
        from ptyprocess import PtyProcess  # small, but only needed once a shell starts

        self._release()
        env = {k: v for k, v in self._base_env.items() if k not in DROP_ENV}
        env.update(QUIET_ENV, PROMPT_COMMAND=self._prompt_command)
        argv = [self.shell, "--noprofile", "--norc", "--noediting", "-i"]
        self._proc = PtyProcess.spawn(
            argv,
            cwd=str(self.workspace),
            env=env,
            echo=False,
            dimensions=DIMENSIONS,
            preexec_fn=_die_with_parent(),
        )
        self._ever_started, self._exited = True, asyncio.Event()
        fd = self._shell_proc.fd
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST  # no "\n" -> "\r\n" translation
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, self._on_readable)
        self._pidfd = os.pidfd_open(self._shell_proc.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._shell_proc.fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: no process holds the pty's other end any more
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self._shell_proc.fd)
            return
        if self._capture is not None:
            self._capture.feed(data)
        elif len(self._pending) < self.max_output:
            self._pending += data

    def _on_exit(self) -> None:
        """The shell ended (pidfd readable): kill what it left behind, reap it, drain the pty."""
        loop = asyncio.get_running_loop()
        assert self._pidfd is not None  # this is its reader, removed before it closes
        loop.remove_reader(self._pidfd)
        pid = self._shell_proc.pid
        kill_session(pid)  # before reaping, so the pid cannot have been reused yet
        try:
            _, status = os.waitpid(pid, 0)
            self.exit_status = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        self._drain()
        self._exited.set()
        if self._capture is not None:
            self._capture.finish()

    def _drain(self) -> None:
        for _ in range(64):
            try:
                data = os.read(self._shell_proc.fd, 65536)
            except OSError:
                return
            if not data:
                return
            if self._capture is not None:
                self._capture.feed(data)

    async def _kill(self) -> None:
        kill_session(self._shell_proc.pid)
        try:
            await asyncio.wait_for(self._exited.wait(), 5.0)
        except TimeoutError:  # should not happen: SIGKILL cannot be ignored
            self.kill_now()

    def _release(self) -> None:
        """Forget a dead shell: readers, pty, pidfd (the process was reaped in _on_exit)."""
        if self._proc is None:
            return
        loop = asyncio.get_running_loop()
        for fd in (self._proc.fd, self._pidfd):
            if fd is not None:
                loop.remove_reader(fd)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._proc.fileobj.close()
        self._proc.closed = True  # ptyprocess must not try to terminate/reap it again
        self._proc = None
        self._pending.clear()


def ansi_c_quote(command: str) -> bytes:
    """``command`` as a bash ``$'...'`` word made of printable ASCII only.

    Every other byte (newlines, control characters that the tty's line discipline would act on
    such as ^C ^D ^U ^V, UTF-8 bytes) and ``\\ ' !`` are written as ``\\xHH`` escapes, so the
    typed line is always one complete line that bash reads back byte for byte.
    """
    return b"$'" + _NEEDS_ESCAPE.sub(_escape, command.encode()) + b"'"


_NEEDS_ESCAPE = re.compile(rb"[^\x20-\x7e]|[\\'!]")


def _escape(match: re.Match[bytes]) -> bytes:
    return b"\\x%02x" % match.group()[0]


def _die_with_parent():
    """A preexec_fn: the shell gets SIGKILL if the thread that spawned it (the server) dies.

    Background jobs do not inherit it, but when the shell (the pty's session leader) dies the
    kernel sends SIGHUP to the terminal's foreground process group, which holds them (job control
    is off), so even a SIGKILLed server leaves nothing running.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the server died before prctl took effect
            os._exit(1)

    return preexec


__all__ = ["BashSession", "Capture"]
