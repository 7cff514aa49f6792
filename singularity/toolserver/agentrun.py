"""Run an agent program inside a sandbox, with the job's LLM endpoint on a loopback address.

    python -m singularity.toolserver.agentrun /workspace/.prorl/run.json

The sandbox has no network but loopback. The job's OpenAI-compatible endpoint listens on a Unix
socket bound into the sandbox (``/run/toolserver/llm.sock``); this runner relays a loopback TCP
port to it, so any program works with ``OPENAI_BASE_URL=http://127.0.0.1:<port>/v1``. Then it:

* reads its configuration and deletes the file (the job's key is not left on disk):
  ``{"socket", "key", "argv" | "shell", "cwd", "env", "log", "host", "port", "model"}``;
* starts the program in a session of its own with ``OPENAI_BASE_URL``, ``OPENAI_API_BASE``,
  ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` (without ``/v1``), ``ANTHROPIC_API_KEY`` and
  ``PRORL_LLM_MODEL`` set (the key reaches this program only), its output to ``log``;
* long-polls the endpoint's ``/_prorl/control``: when the job wants the program to end (a limit
  was reached, the job was cancelled, the endpoint closed) or this runner is interrupted, the
  program's process group gets SIGTERM, then SIGKILL after ``grace_s``;
* prints one line ``PRORL_AGENT_RESULT {"exit_code", "stopped", "port", "seconds"}`` and exits
  with the program's exit code.

Standard library only: it runs with the sandbox's interpreter, before anything is imported.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

RESULT_PREFIX = "PRORL_AGENT_RESULT "
#: the per-job LLM endpoint's socket: beside the tool server's (the socket directory bound into
#: the sandbox), served by the worker for the time of RUN
ENDPOINT_SOCKET = "llm.sock"
ENDPOINT_INSIDE = f"/run/toolserver/{ENDPOINT_SOCKET}"


# -- loopback TCP -> Unix socket ------------------------------------------------------------------

async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


class Forwarder:
    """``host:port`` (0: any free port) relayed to the Unix socket, on a loop in its own thread."""

    def __init__(self, socket_path: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.socket_path, self.host, self.port = socket_path, host, port
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="llm-forwarder", daemon=True)

    def start(self) -> int:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self.port

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            server = self._loop.run_until_complete(asyncio.start_server(self._client, self.host, self.port))
            self.port = server.sockets[0].getsockname()[1]
        except BaseException as error:  # noqa: BLE001 - reported to start()
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError:
            writer.close()  # the endpoint is gone: the job ended
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


# -- the control channel ------------------------------------------------------------------------------

class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("endpoint", timeout=None)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.unix_path)
        self.sock = sock


def wait_for_stop(socket_path: str, key: str) -> str:
    """Block until the endpoint asks the program to end (or cannot be reached); the reason."""
    try:
        connection = _UnixHTTPConnection(socket_path)
        connection.request("GET", "/_prorl/control", headers={"Authorization": f"Bearer {key}"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return f"control answered {response.status}"
        return str(json.loads(body or b"{}").get("stop") or "stop")
    except (OSError, http.client.HTTPException, ValueError) as error:
        return f"endpoint gone ({type(error).__name__})"


# -- the program ----------------------------------------------------------------------------------------

def _stop(process: subprocess.Popen, grace_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(config: dict) -> dict:
    started = time.monotonic()
    forwarder = Forwarder(config["socket"], config.get("host", "127.0.0.1"), int(config.get("port", 0)))
    port = forwarder.start()
    base = f"http://{forwarder.host}:{port}/v1"
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (config.get("env") or {}).items()})
    env.update({"OPENAI_BASE_URL": base, "OPENAI_API_BASE": base, "OPENAI_API_KEY": config["key"],
                # Anthropic's SDKs (and Claude Code) append /v1/messages to the base URL themselves
                "ANTHROPIC_BASE_URL": f"http://{forwarder.host}:{port}", "ANTHROPIC_API_KEY": config["key"],
                "PRORL_LLM_MODEL": str(config.get("model", "policy"))})
    argv = config.get("argv") or ["/bin/sh", "-c", config["shell"]]
    log_path = config.get("log") or os.devnull
    if log_path != os.devnull:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    stopped: list[str] = []
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, cwd=config.get("cwd") or None, env=env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def control() -> None:
            reason = wait_for_stop(config["socket"], config["key"])
            if process.poll() is None:
                stopped.append(reason)
                _stop(process, float(config.get("grace_s", 5.0)))

        threading.Thread(target=control, name="control", daemon=True).start()
        try:
            exit_code = process.wait()
        except KeyboardInterrupt:  # the tool server's timeout interrupts this runner
            stopped.append("interrupted")
            _stop(process, float(config.get("grace_s", 5.0)))
            exit_code = process.wait()
    return {"exit_code": exit_code, "stopped": stopped[0] if stopped else None, "port": port,
            "seconds": round(time.monotonic() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m singularity.toolserver.agentrun CONFIG.json", file=sys.stderr)
        return 2
    with open(args[0]) as handle:
        config = json.load(handle)
    os.unlink(args[0])
    result = run(config)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    code = result["exit_code"]
    return code if isinstance(code, int) and 0 <= code < 256 else 1


if __name__ == "__main__":
    sys.exit(main())
