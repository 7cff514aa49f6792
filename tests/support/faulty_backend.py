"""A faulty LLM backend: a real HTTP proxy on a loopback port in front of a working one.

GET requests (``/v1/models``, ``/health``: what ``/add_llm_server`` and the health probes ask)
always pass through, so the backend registers and probes as healthy; ``POST /v1/completions``,
the one call a job's turn makes, is corrupted per :attr:`FaultyBackend.mode`:

==============  ==========================================================================
mode            what a job's turn gets
==============  ==========================================================================
pass            the upstream's answer, untouched
http_500        ``500`` with a vLLM-style error body (an engine that crashed on the request)
refuse          the connection reset (RST) before any answer: a server gone mid-job
short_logprobs  the upstream's answer with its last logprob dropped: fewer logprobs than ids
==============  ==========================================================================

The proxy is a ``ThreadingHTTPServer`` in a thread of the test process; the workers reach it
over TCP like any backend. ``calls`` counts the corrupted requests per mode.
"""
from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

MODES = ("pass", "http_500", "refuse", "short_logprobs")
COMPLETIONS = "/v1/completions"


class FaultyBackend:
    """``with FaultyBackend(upstream, "http_500") as proxy:`` register ``proxy.address()``."""

    def __init__(self, upstream: str, mode: str = "pass") -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode = mode
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"faulty-backend-{self.port}",
                                        daemon=True)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self._mode = mode

    def address(self) -> str:
        """The vLLM address to register with ``/add_llm_server``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def count(self, mode: str) -> None:
        with self._lock:
            self.calls[mode] += 1

    def forward(self, method: str, path: str, body: bytes | None,
                headers: dict[str, str]) -> tuple[int, str, bytes]:
        """The upstream's (status, content type, body) for one request."""
        connection = http.client.HTTPConnection(*self.upstream, timeout=300)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type", "application/json"), response.read()
        finally:
            connection.close()

    def __enter__(self) -> FaultyBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


def _handler(proxy: FaultyBackend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server: the client's pool reuses it

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            pass  # quiet: a test's output is its own

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._reply(*proxy.forward("GET", self.path, None, self._headers()))

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            mode = proxy.mode if urlsplit(self.path).path == COMPLETIONS else "pass"
            if mode != "pass":
                proxy.count(mode)
            if mode == "refuse":
                self._reset()
                return
            if mode == "http_500":
                error = {"error": {"message": "injected engine failure (tests/support/faulty_backend.py)",
                                   "type": "InternalServerError", "code": 500}}
                self._reply(500, "application/json", json.dumps(error).encode())
                return
            status, content_type, data = proxy.forward("POST", self.path, body, self._headers())
            if mode == "short_logprobs" and status == 200:
                data = _drop_last_logprob(data)
            self._reply(status, content_type, data)

        def _headers(self) -> dict[str, str]:
            return {"Content-Type": self.headers.get("Content-Type", "application/json")}

        def _reply(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _reset(self) -> None:
            """Close with SO_LINGER 0: the kernel sends RST, the client reads 'connection reset'."""
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    return Handler


def _drop_last_logprob(data: bytes) -> bytes:
    reply = json.loads(data)
    for choice in reply.get("choices") or []:
        logprobs = choice.get("logprobs") or {}
        if logprobs.get("token_logprobs"):
            logprobs["token_logprobs"] = logprobs["token_logprobs"][:-1]
    return json.dumps(reply).encode()
