"""Pieces of the tool server tested in-process: the output capture, the models, the search
backends (HTTP against a tiny local server) and the editor's path confinement."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from singularity.toolserver import protocol
from singularity.toolserver.capture import Capture
from singularity.toolserver.editor import Editor
from singularity.toolserver.errors import ToolError, ToolServerGone, ToolTimeout
from singularity.toolserver.search import (
    BM25Backend,
    HTTPSearchBackend,
    SearchBackend,
    SearchTool,
)

SENTINEL = re.compile(rb"\r?\n__TS_abc_(\d+)__\r?\n")


def feed_all(capture: Capture, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        capture.feed(data[i : i + step])


@pytest.mark.parametrize("step", [1, 3, 7, 64, 100000])
def test_capture_finds_a_sentinel_split_across_chunks(step):
    capture = Capture(1024, SENTINEL)
    feed_all(capture, b"hello\nworld\n\n__TS_abc_42__\nlater", step)
    assert capture.done and capture.exit_code == 42
    assert capture.output() == ("hello\nworld\n", False)
    assert capture.leftover == b"later"


@pytest.mark.parametrize("step", [1, 13, 4096])
def test_capture_keeps_head_and_tail_and_counts_the_dropped_bytes(step):
    body = b"".join(b"%06d\n" % i for i in range(5000))  # 35000 bytes
    capture = Capture(1000, SENTINEL)
    feed_all(capture, body + b"\n__TS_abc_0__\n", step)
    text, truncated = capture.output()
    head, note, tail = text.partition("\n[... ")
    assert (
        truncated
        and body.decode().startswith(head)
        and body.decode().endswith(tail.split("...]\n", 1)[1])
    )
    assert f"{len(body) - 1000} bytes of output dropped" in text


def test_capture_without_sentinel_returns_everything_seen():
    capture = Capture(100, SENTINEL)
    capture.feed(b"partial")
    capture.finish()
    assert capture.done and capture.exit_code is None and capture.output() == ("partial", False)


def test_models_forbid_unknown_fields_and_check_the_envelope():
    with pytest.raises(protocol.ValidationError, match="unknown field `cwd`"):
        protocol.BashArgs.parse({"command": "ls", "cwd": "/"})
    with pytest.raises(protocol.ValidationError, match="either ok=true"):
        protocol.Response.parse({"id": 1, "ok": True, "error": {"code": "x", "message": "y"}})
    with pytest.raises(protocol.ValidationError, match="timeout_s"):
        protocol.parse_args("bash", {"command": "ls", "timeout_s": 0})
    with pytest.raises(protocol.ValidationError, match="old_str"):
        protocol.parse_args("editor", {"command": "str_replace", "path": "a", "old_str": ""})
    editor = protocol.parse_args("editor", {"command": "insert", "path": "a", "insert_line": 0, "new_str": "x"})
    assert isinstance(editor, protocol.InsertArgs) and editor.command == "insert"
    assert isinstance(protocol.parse_request(b'{"id": 2, "tool": "ping"}'), protocol.Request)
    with pytest.raises(ValueError):
        protocol.parse_request(b"{not json")
    frame = protocol.encode({"id": 1})
    assert frame[:4] == (len(frame) - 4).to_bytes(4, "big")


def test_error_tree():
    assert isinstance(ToolTimeout("x"), TimeoutError) and isinstance(
        ToolServerGone("x"), ConnectionError
    )
    assert isinstance(ToolError.from_payload("timeout", "m"), ToolTimeout)
    error = ToolError.from_payload("no_match", "m")
    assert type(error) is ToolError and error.code == "no_match" and str(error) == "[no_match] m"


# -- search backends -----------------------------------------------------------------------------


class _SearchHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["query"] == "fail":
            self.send_response(500)
            self.end_headers()
            return
        hits = [
            {
                "id": i,
                "title": f"t{i}",
                "text": body["query"],
                "score": 1.0 / (i + 1),
                "url": "extra fields are dropped",
            }
            for i in range(10)
        ]
        payload = json.dumps({"results": hits}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def search_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SearchHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/search"
    httpd.shutdown()
    httpd.server_close()


def test_http_search_backend(search_url):
    backend = HTTPSearchBackend(search_url, timeout_s=10)
    assert isinstance(backend, SearchBackend)
    result = asyncio.run(SearchTool(backend)(protocol.SearchArgs(query="graphs", k=3)))
    assert [h.id for h in result.hits] == ["0", "1", "2"] and result.hits[0].text == "graphs"
    with pytest.raises(ToolError) as caught:
        backend.search("fail", 3)
    assert caught.value.code == "search_failed"


def test_http_search_backend_unreachable():
    with pytest.raises(ToolError) as caught:
        HTTPSearchBackend("http://127.0.0.1:9/none", timeout_s=5).search("q", 1)
    assert caught.value.code == "search_failed"


def test_bm25_backend_and_a_custom_backend(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": 1, "title": "Cats", "text": "cats purr and sleep"}\n\n'
        '{"id": 2, "title": "Dogs", "text": "dogs bark loudly"}\n'
    )
    hits = BM25Backend(corpus).search("why do dogs bark", 5)
    assert [h["id"] for h in hits] == ["2"] and hits[0]["title"] == "Dogs"

    class Fixed:
        def search(self, query, k):
            return [{"id": "a", "text": query, "score": 1}]

    result = asyncio.run(SearchTool(Fixed())(protocol.SearchArgs(query="hello")))
    assert result.hits[0].text == "hello" and result.hits[0].title == ""


# -- editor confinement ------------------------------------------------------------------------


def test_editor_resolve_rejects_escapes(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "inner").mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    (workspace / "inner" / "up").symlink_to(tmp_path)
    editor = Editor(workspace, 1000)
    assert editor.resolve("inner/../a.txt") == (workspace / "a.txt").resolve()
    for escape in ["../secret", str(tmp_path / "secret"), "inner/up/secret", "inner/up"]:
        with pytest.raises(ToolError) as caught:
            editor.resolve(escape)
        assert caught.value.code == "path_outside_workspace"


def test_server_config_picks_the_search_backend(tmp_path):
    from singularity.toolserver.server import ServerConfig

    assert ServerConfig(workspace=tmp_path).search_backend() is None
    corpus = ServerConfig(workspace=tmp_path, search_corpus=tmp_path / "c.jsonl")
    assert isinstance(corpus.search_backend(), BM25Backend)
    both = ServerConfig(workspace=tmp_path, search_corpus=tmp_path / "c", search_url="http://h/s")
    assert isinstance(both.search_backend(), HTTPSearchBackend)


def test_a_socket_path_longer_than_sockaddr_un_still_works(tmp_path):
    """The kernel takes at most 107 bytes; deep state directories are reached through /proc."""
    from singularity.toolserver.client import ToolClient
    from singularity.toolserver.launch import LocalToolServer
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    (workspace := tmp_path / "ws").mkdir()
    socket = deep / "tools.sock"
    assert len(str(socket)) > 120
    server = LocalToolServer.start(socket, workspace)
    try:
        async def ping():
            async with ToolClient(socket) as tools:
                return await tools.bash("echo reached")
        assert asyncio.run(ping()).output.strip() == "reached"
    finally:
        assert server.stop() == 0
    assert not socket.exists()
