"""A unit test starts no process: an audit hook fails any that does, naming what it started.

The hook sees every process start of the interpreter (``subprocess.Popen``, ``os.fork``,
``os.posix_spawn``, ``os.system``), whoever calls it; it acts only while a test of this folder
runs, so the integration tests of the same session are untouched.
"""
from __future__ import annotations

import sys

import pytest

SPAWNS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                    "os.exec"})
_running: list[str] = []


def _refuse_processes(event: str, args: tuple) -> None:
    if _running and event in SPAWNS:
        raise RuntimeError(f"the unit test {_running[-1]} started a process ({event}: {str(args)[:200]}); "
                           f"a test that starts one belongs in tests/integration/")


sys.addaudithook(_refuse_processes)


@pytest.fixture(autouse=True)
def _no_process_started(request: pytest.FixtureRequest):
    _running.append(request.node.nodeid)
    try:
        yield
    finally:
        _running.pop()
