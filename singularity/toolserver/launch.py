"""Starting a tool server as a local process: its command line, and a handle that waits for READY.

Runtimes build the command with :func:`command` (and wrap it in ``bwrap``/``apptainer exec``);
tests, benchmarks and the plain-process runtime can use :class:`LocalToolServer` directly.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding ``singularity/``


def command(
    socket: str | os.PathLike | None,
    workspace: str | os.PathLike,
    *,
    python: str = sys.executable,
    tcp: str | None = None,
    search_corpus: str | os.PathLike | None = None,
    search_url: str | None = None,
    max_output: int | None = None,
    lazy_shell: bool = False,
    log_level: str | None = None,
    no_site: bool = False,
) -> list[str]:
    """The argv of ``python -m singularity.toolserver`` with these options.

    ``no_site`` adds ``-S``: the interpreter skips ``site`` (the .pth files of site-packages,
    such as editable-install finders), which saves tens of milliseconds of start-up; the
    environment must then put site-packages on PYTHONPATH (``environment(no_site=True)``).
    """
    argv = [
        python,
        *(["-S"] if no_site else []),
        "-m",
        "singularity.toolserver",
        "--workspace",
        str(workspace),
    ]
    options = {
        "--socket": socket,
        "--tcp": tcp,
        "--search-corpus": search_corpus,
        "--search-url": search_url,
        "--max-output": max_output,
        "--log-level": log_level,
    }
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--lazy-shell"] if lazy_shell else [])


def environment(base: dict[str, str] | None = None, no_site: bool = False) -> dict[str, str]:
    """``base`` (default: os.environ) with this checkout first on PYTHONPATH, and with
    ``no_site`` this interpreter's site-packages after it (for ``python -S``)."""
    env = dict(os.environ if base is None else base)
    paths = [str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if no_site:
        import site

        paths += site.getsitepackages() + [site.getusersitepackages()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class LocalToolServer:
    """A tool server child process (in its own session), started and stopped by this handle."""

    def __init__(self, process: subprocess.Popen, addresses: list[str], ready_s: float) -> None:
        self.process, self.addresses, self.ready_s = process, addresses, ready_s

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def socket(self) -> str | None:
        return next((a for a in self.addresses if not a.startswith("tcp:")), None)

    @property
    def tcp(self) -> tuple[str, int] | None:
        address = next((a for a in self.addresses if a.startswith("tcp:")), None)
        if address is None:
            return None
        host, _, port = address[4:].rpartition(":")
        return host, int(port)

    @classmethod
    def start(
        cls,
        socket: str | os.PathLike | None,
        workspace: str | os.PathLike,
        *,
        timeout_s: float = 30.0,
        stderr: IO | int | None = None,
        env: dict[str, str] | None = None,
        no_site: bool = False,
        **options,
    ) -> LocalToolServer:
        """Spawn the server and wait for its READY line (RuntimeError if it never comes)."""
        started = time.perf_counter()
        argv = command(socket, workspace, no_site=no_site, **options)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environment(env, no_site=no_site),
            start_new_session=True,
        )
        try:
            line = _read_line(process, timeout_s)
        except BaseException:
            _kill(process)
            raise
        if not line.startswith("READY "):
            _kill(process)
            raise RuntimeError(f"tool server did not start (exit {process.poll()}): {line!r}")
        return cls(process, line.split()[1:], time.perf_counter() - started)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL to the whole process group after ``timeout_s``; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _kill(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    data = b""
    assert process.stdout is not None  # started with stdout=PIPE
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"tool server not ready within {timeout_s} s")
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
