"""The tool server's protocol edges, the client's errors, and a clean exit leaving no process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from singularity.toolserver import protocol
from singularity.toolserver.client import ToolClient
from singularity.toolserver.errors import ToolError, ToolServerGone, ToolTimeout
from singularity.toolserver.launch import LocalToolServer
from singularity.toolserver.procs import is_running, session_members


def run(coro):
    return asyncio.run(coro)


def start(tmp: Path, **options) -> LocalToolServer:
    (tmp / "workspace").mkdir()
    log = open(tmp / "toolserver.log", "ab")
    return LocalToolServer.start(
        tmp / "tools.sock", tmp / "workspace", stderr=log, log_level="INFO", **options
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A server for the tests that leave it running."""
    handle = start(tmp_path_factory.mktemp("shared"), tcp="127.0.0.1:0")
    yield handle
    assert handle.stop() == 0


@pytest.fixture
def server(tmp_path):
    """A server of the test's own, which it may kill or stop."""
    handle = start(tmp_path)
    yield handle
    handle.stop(timeout_s=5)


def raw_exchange(path: str, body: bytes) -> dict:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
        return json.loads(sock.recv(size, socket.MSG_WAITALL))


def wait_gone(pids: list[int], timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if is_running(p)]


# -- protocol ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, code, request_id",
    [
        (b"not json", "bad_request", None),
        (b'{"id": 1, "tool": "ping", "args": {}, "extra": 1}', "bad_request", 1),
        (b'{"id": 2, "tool": "nope", "args": {}}', "unknown_tool", 2),
        (b'{"id": 3, "tool": "bash", "args": {"command": "ls", "timeout": 5}}', "bad_request", 3),
        (
            b'{"id": 4, "tool": "bash", "args": {"command": "ls", "timeout_s": -1}}',
            "bad_request",
            4,
        ),
        (
            b'{"id": 5, "tool": "editor", "args": {"command": "chmod", "path": "x"}}',
            "bad_request",
            5,
        ),
    ],
)
def test_bad_requests_get_typed_errors(shared, body, code, request_id):
    response = protocol.Response.parse(raw_exchange(shared.socket, body))
    assert not response.ok and response.error.code == code and response.id == request_id


def test_responses_pair_by_id_and_calls_run_concurrently(shared):
    async def scenario():
        async with ToolClient(shared.socket) as tools:
            slow = asyncio.ensure_future(tools.bash("sleep 2; echo slow", timeout_s=30))
            await asyncio.sleep(0.1)
            pong = await tools.ping()
            pinged_before_slow_finished = not slow.done()
            return pong, pinged_before_slow_finished, await slow

    pong, early, slow = run(scenario())
    assert pong.pid == shared.pid and early and slow.output == "slow\n"


def test_ready_line_names_the_socket_and_tcp(shared):
    assert shared.socket.endswith("tools.sock") and shared.tcp[1] > 0

    async def both():
        async with ToolClient(tcp=shared.tcp) as over_tcp, ToolClient(shared.socket) as over_unix:
            return await over_tcp.bash("echo tcp"), await over_unix.ping()

    echoed, pong = run(both())
    assert echoed.output == "tcp\n" and pong.pid == shared.pid


def test_search_without_a_backend(shared):
    with pytest.raises(ToolError) as caught:
        run(ToolClient(shared.socket).search("anything"))
    assert caught.value.code == "search_unavailable"


# -- client errors ------------------------------------------------------------------------------


def test_connect_to_a_missing_server_raises_server_gone(tmp_path):
    with pytest.raises(ToolServerGone) as caught:
        run(ToolClient(tmp_path / "nobody.sock").ping())
    assert isinstance(caught.value, ConnectionError) and caught.value.code == "server_gone"


def test_server_death_fails_calls_in_flight_and_later(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            in_flight = asyncio.ensure_future(tools.bash("sleep 60", timeout_s=60))
            await asyncio.sleep(0.2)
            os.kill(server.pid, signal.SIGKILL)
            errors = []
            for attempt in (in_flight, tools.ping()):
                try:
                    await attempt
                except ToolError as exc:
                    errors.append(exc)
            return errors

    errors = run(scenario())
    assert len(errors) == 2 and all(isinstance(e, ToolServerGone) for e in errors)


def test_no_answer_within_the_deadline_raises_tool_timeout(server):
    async def scenario():
        async with ToolClient(server.socket, margin_s=0.2) as tools:
            # ignores Ctrl-C: the server needs its grace period and a shell restart to answer
            await tools.bash("trap '' INT; sleep 60", timeout_s=0.2)

    with pytest.raises(ToolTimeout) as caught:
        run(scenario())
    assert isinstance(caught.value, TimeoutError) and caught.value.code == "timeout"


# -- clean exit ---------------------------------------------------------------------------------


def _shell_and_job(tools_socket: str) -> tuple[int, int]:
    async def scenario():
        async with ToolClient(tools_socket) as tools:
            shell = await tools.bash("echo $$")
            job = await tools.bash("sleep 100 & echo $!")
            return int(shell.output), int(job.output.split()[-1])  # after "[1] <pid>"

    return run(scenario())


def test_sigterm_kills_the_shell_and_its_jobs(server):
    shell, job = _shell_and_job(server.socket)
    assert is_running(shell) and is_running(job) and job in session_members(shell)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(20) == 0
    assert wait_gone([shell, job]) == []
    assert not os.path.exists(server.socket)


def test_shutdown_tool_stops_the_server(server):
    shell, job = _shell_and_job(server.socket)
    run(ToolClient(server.socket).shutdown())
    assert server.process.wait(20) == 0
    assert wait_gone([shell, job]) == []


def test_sigterm_while_a_cell_sleeps(server):
    async def scenario():
        async with ToolClient(server.socket) as tools:
            await tools.ipython("1", timeout_s=60)  # start the kernel
            cell = asyncio.ensure_future(
                tools.ipython("import time; time.sleep(100)", timeout_s=100)
            )
            await asyncio.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ToolError):
                await cell

    run(scenario())
    assert server.process.wait(20) == 0


def test_sigkill_of_the_server_still_ends_the_shell(server):
    shell, job = _shell_and_job(server.socket)
    os.killpg(server.pid, signal.SIGKILL)
    server.process.wait(20)
    assert wait_gone([shell, job]) == []
