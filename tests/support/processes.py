"""Processes of a test, found through /proc (never by name: other runs share the machine)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

#: the environment of a `prorl up` under test: its own Redis and address, whatever the caller's
UP_ENV = {key: value for key, value in os.environ.items()
          if key not in {"PRORL_REDIS_URL", "PRORL_REDIS_PERSISTENCE", "PRORL_GATEWAY_BIND"}}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc (never by name)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def prorl_up(state_dir: Path, port: int, *options: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``prorl up`` on ``port`` (its Redis data under ``state_dir``) until the block ends: yields
    the gateway URL and the environment to run commands against it (this python's ``prorl``
    first on PATH); stops it, and every process below it, afterwards."""
    env = {**UP_ENV, "XDG_STATE_HOME": str(state_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    up = subprocess.Popen([sys.executable, "-m", "prorl_celery.cli", "up", "--port", str(port), *options],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True)
    try:
        printed = []
        for line in up.stdout:
            printed.append(line)
            if line.startswith("Ctrl-C"):
                break
        gateway = f"http://127.0.0.1:{port}"
        assert any(line.startswith(f"gateway  {gateway}") for line in printed), printed
        yield gateway, env
    finally:
        stop_group(up, signal.SIGINT)


def stop_group(process: subprocess.Popen, sig: int = signal.SIGKILL, wait_s: float = 60) -> None:
    """Stop a process started with ``start_new_session`` and everything below it."""
    if process.poll() is not None:
        return
    children = descendants(process.pid)
    os.killpg(process.pid, sig)
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_script(script: str, cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """Run a bash script in a session of its own; its exit status and output (stderr in it).
    Whatever it left running (a server started with ``&``) is stopped afterwards."""
    shell = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = shell.communicate(timeout=timeout_s)
    finally:
        stop_group(shell)
    return shell.returncode, output
