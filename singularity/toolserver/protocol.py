"""The tool server's wire protocol: typed requests and responses, and their framing.

Framing: every message is one frame, a 4-byte big-endian unsigned length followed by that many
bytes of UTF-8 JSON (one object). Frames may not exceed :data:`MAX_FRAME` bytes. Requests and
responses flow over one stream connection (Unix socket, or TCP loopback for comparison);
several requests may be in flight on one connection, and responses may come back in any order:
the ``id`` pairs them.

Envelope::

    request   {"id": 7, "tool": "bash", "args": {"command": "ls", "timeout_s": 30}}
    response  {"id": 7, "ok": true,  "result": {...the tool's result model...}}
              {"id": 7, "ok": false, "error": {"code": "no_match", "message": "..."}}

Tools and their models (every model forbids unknown fields, so a typo fails loudly):

    ping       PingArgs      -> PingResult
    shutdown   ShutdownArgs  -> ShutdownResult   (the server answers, then exits)
    bash       BashArgs      -> BashResult
    ipython    IPythonArgs   -> IPythonResult
    editor     EditorArgs    -> EditorResult     (EditorArgs is a union keyed by ``command``)
    search     SearchArgs    -> SearchResult
    warm       WarmArgs      -> WarmResult       (start the shell, the kernel, the index now)

The error codes are listed in :mod:`singularity.toolserver.errors`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Union

import msgspec

MAX_FRAME = 64 * 1024 * 1024
HEADER_BYTES = 4
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 24 * 3600.0
#: the environment variable that gives the server its BM25 corpus when ``--search-corpus`` is not
#: passed (runtimes pass a sandbox's environment through; its command line is fixed)
SEARCH_CORPUS_ENV = "TOOLSERVER_SEARCH_CORPUS"

#: what a message that fails its model raises (a ``ValueError``)
ValidationError = msgspec.ValidationError


class Model(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every protocol message: unknown fields fail loudly.

    msgspec, not pydantic, because the tool server starts in every sandbox and its start-up
    time is a sandbox's time to ready: msgspec imports in about a millisecond, pydantic and its
    schemas cost most of the server's start (bench/sandbox.py measures both).
    """

    @classmethod
    def parse(cls, data: Any) -> Any:
        """The model from a decoded JSON value; :data:`ValidationError` when it does not fit."""
        return msgspec.convert(data, cls)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


# -- envelope ------------------------------------------------------------------------------------


class Request(Model):
    id: Union[int, str]
    tool: str
    args: dict[str, Any] = {}


class ErrorInfo(Model):
    code: str
    message: str


class Response(Model):
    id: Union[int, str, None]  # None only when the request was too broken to read its id
    ok: bool
    result: Union[dict[str, Any], None] = None
    error: Union[ErrorInfo, None] = None

    def __post_init__(self) -> None:
        if self.ok != (self.error is None) or (not self.ok and self.result is not None):
            raise ValueError("a response has either ok=true and a result, or ok=false and an error")


# -- per tool -----------------------------------------------------------------------------------

Timeout = Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT_S)]


class PingArgs(Model):
    pass


class PingResult(Model):
    pid: int
    uptime_s: float
    pong: bool = True


class ShutdownArgs(Model):
    pass


class ShutdownResult(Model):
    stopping: bool = True


class BashArgs(Model):
    command: str
    timeout_s: Timeout = DEFAULT_TIMEOUT_S


class BashResult(Model):
    output: str
    exit_code: Union[int, None]  # None when unknown (the command was killed with the shell)
    timed_out: bool = False
    truncated: bool = False
    shell_restarted: bool = False  # the shell died or had to be killed; its state was lost


class IPythonArgs(Model):
    code: str
    timeout_s: Timeout = DEFAULT_TIMEOUT_S


class IPythonResult(Model):
    stdout: str = ""
    stderr: str = ""
    result: Union[str, None] = None  # text/plain repr of the cell's value, if any
    error: Union[str, None] = None  # "ExceptionName: message" when the cell raised
    traceback: Union[str, None] = None
    timed_out: bool = False
    truncated: bool = False
    kernel_busy: bool = False  # the cell ignored the interrupt and is still running


class _EditorBase(Model, tag_field="command"):
    """Editor arguments: a union tagged by ``command`` (the tag is each class's ``command``)."""

    command: ClassVar[str]
    path: str


class ViewArgs(_EditorBase, tag="view"):
    command: ClassVar[str] = "view"
    view_range: Union[tuple[int, int], None] = None  # 1-based, inclusive; end -1 = to the end


class CreateArgs(_EditorBase, tag="create"):
    command: ClassVar[str] = "create"
    file_text: str
    overwrite: bool = False


class StrReplaceArgs(_EditorBase, tag="str_replace"):
    command: ClassVar[str] = "str_replace"
    old_str: Annotated[str, msgspec.Meta(min_length=1)]
    new_str: str = ""


class InsertArgs(_EditorBase, tag="insert"):
    command: ClassVar[str] = "insert"
    insert_line: Annotated[int, msgspec.Meta(ge=0)]  # insert after this line; 0 = at the top
    new_str: str


class UndoArgs(_EditorBase, tag="undo"):
    command: ClassVar[str] = "undo"


EditorArgs = Union[ViewArgs, CreateArgs, StrReplaceArgs, InsertArgs, UndoArgs]


class EditorResult(Model):
    output: str
    path: str  # the path relative to the workspace
    truncated: bool = False


class SearchArgs(Model):
    query: Annotated[str, msgspec.Meta(min_length=1)]
    k: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5


class SearchHit(Model):
    id: str
    text: str
    score: float
    title: str = ""


class SearchResult(Model):
    hits: list[SearchHit]


class WarmArgs(Model):
    """What to start before a job needs it (a warm pool's sandbox): the shell always; the
    IPython kernel and the search index when asked. Runs no user code."""

    ipython: bool = False
    search: bool = False


class WarmResult(Model):
    shell: bool
    ipython: bool
    search: bool
    seconds: float


TOOLS: dict[str, tuple[Any, type[Model]]] = {
    "ping": (PingArgs, PingResult),
    "shutdown": (ShutdownArgs, ShutdownResult),
    "bash": (BashArgs, BashResult),
    "ipython": (IPythonArgs, IPythonResult),
    "editor": (EditorArgs, EditorResult),
    "search": (SearchArgs, SearchResult),
    "warm": (WarmArgs, WarmResult),
}
_REQUEST_DECODER = msgspec.json.Decoder(Request)
_ENCODER = msgspec.json.Encoder()


def parse_args(tool: str, args: dict[str, Any]) -> Any:
    """``tool``'s validated arguments (KeyError for an unknown tool, ValidationError for bad ones)."""
    return msgspec.convert(args, TOOLS[tool][0])


def parse_request(body: bytes) -> Request:
    """The request envelope of a frame body; ValidationError (a ValueError) when it is not one."""
    try:
        return _REQUEST_DECODER.decode(body)
    except msgspec.DecodeError as exc:  # not JSON at all: the same error family for the server
        raise ValidationError(str(exc)) from exc


def parse_response(body: bytes) -> Response:
    return msgspec.json.decode(body, type=Response)


def result_model(tool: str) -> type[Model]:
    return TOOLS[tool][1]


def ok_body(request_id: int | str, result: Model) -> bytes:
    """The JSON of a successful :class:`Response` (built without a dict round trip)."""
    return b'{"id":%s,"ok":true,"result":%s}' % (_ENCODER.encode(request_id), _ENCODER.encode(result))


def error_body(request_id: int | str | None, code: str, message: str) -> bytes:
    """The JSON of an error :class:`Response`."""
    return _ENCODER.encode({"id": request_id, "ok": False, "error": {"code": code, "message": message}})


# -- framing ------------------------------------------------------------------------------------


class FrameError(ValueError):
    """A frame that cannot be read: too large, or not a JSON object."""


def frame(body: bytes) -> bytes:
    """One frame: the 4-byte big-endian length of ``body``, then ``body``."""
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the limit of {MAX_FRAME}")
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def encode(message: dict[str, Any] | Model) -> bytes:
    """A message (a dict, or a model without its unset optional fields) as one frame."""
    if isinstance(message, Model):
        message = {k: v for k, v in message.to_dict().items() if v is not None}
    return frame(_ENCODER.encode(message))


class FrameReader:
    """Splits a byte stream into frame bodies, for ``asyncio.Protocol.data_received``.

    Protocol callbacks rather than ``StreamReader``: a stream reader costs a task wake-up per
    frame on each side, a measurable share of a bash call that takes a tenth of a millisecond.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished frame are waiting (a stream that ends now is cut)."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies of the frames that ``data`` completes; :class:`FrameError` for one over
        the limit (the stream cannot be resynchronised after that)."""
        buffer = self._buffer
        if not buffer and len(data) >= HEADER_BYTES:  # the common case: whole frames at once
            size = int.from_bytes(data[:HEADER_BYTES], "big")
            if len(data) == HEADER_BYTES + size and size <= MAX_FRAME:
                return [data[HEADER_BYTES:]]
        buffer += data
        bodies = []
        while len(buffer) >= HEADER_BYTES:
            size = int.from_bytes(buffer[:HEADER_BYTES], "big")
            if size > MAX_FRAME:
                raise FrameError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME}")
            end = HEADER_BYTES + size
            if len(buffer) < end:
                break
            bodies.append(bytes(buffer[HEADER_BYTES:end]))
            del buffer[:end]
        return bodies
