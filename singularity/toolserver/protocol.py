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

The error codes are listed in :mod:`singularity.toolserver.errors`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

MAX_FRAME = 64 * 1024 * 1024
HEADER_BYTES = 4
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 24 * 3600.0
#: the environment variable that gives the server its BM25 corpus when ``--search-corpus`` is not
#: passed (runtimes pass a sandbox's environment through; its command line is fixed)
SEARCH_CORPUS_ENV = "TOOLSERVER_SEARCH_CORPUS"


class Model(BaseModel):
    # defer_build: schemas are built on first use, which keeps the server's start-up short
    model_config = ConfigDict(extra="forbid", defer_build=True)


# -- envelope ------------------------------------------------------------------------------------


class Request(Model):
    id: int | str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class ErrorInfo(Model):
    code: str
    message: str


class Response(Model):
    id: int | str | None  # None only when the request was too broken to read its id
    ok: bool
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _one_of_result_or_error(self) -> Response:
        if self.ok != (self.error is None) or (not self.ok and self.result is not None):
            raise ValueError("a response has either ok=true and a result, or ok=false and an error")
        return self


# -- per tool -----------------------------------------------------------------------------------

Timeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]


class PingArgs(Model):
    pass


class PingResult(Model):
    pong: Literal[True] = True
    pid: int
    uptime_s: float


class ShutdownArgs(Model):
    pass


class ShutdownResult(Model):
    stopping: Literal[True] = True


class BashArgs(Model):
    command: str
    timeout_s: Timeout = DEFAULT_TIMEOUT_S


class BashResult(Model):
    output: str
    exit_code: int | None  # None when unknown (the command was killed with the shell)
    timed_out: bool = False
    truncated: bool = False
    shell_restarted: bool = False  # the shell died or had to be killed; its state was lost


class IPythonArgs(Model):
    code: str
    timeout_s: Timeout = DEFAULT_TIMEOUT_S


class IPythonResult(Model):
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain repr of the cell's value, if any
    error: str | None = None  # "ExceptionName: message" when the cell raised
    traceback: str | None = None
    timed_out: bool = False
    truncated: bool = False
    kernel_busy: bool = False  # the cell ignored the interrupt and is still running


class _EditorBase(Model):
    path: str


class ViewArgs(_EditorBase):
    command: Literal["view"] = "view"
    view_range: tuple[int, int] | None = None  # 1-based, inclusive; end -1 = to the end


class CreateArgs(_EditorBase):
    command: Literal["create"] = "create"
    file_text: str
    overwrite: bool = False


class StrReplaceArgs(_EditorBase):
    command: Literal["str_replace"] = "str_replace"
    old_str: str = Field(min_length=1)
    new_str: str = ""


class InsertArgs(_EditorBase):
    command: Literal["insert"] = "insert"
    insert_line: int = Field(ge=0)  # insert after this line; 0 = at the top
    new_str: str


class UndoArgs(_EditorBase):
    command: Literal["undo"] = "undo"


EditorArgs = Annotated[
    Union[ViewArgs, CreateArgs, StrReplaceArgs, InsertArgs, UndoArgs],
    Field(discriminator="command"),
]


class EditorResult(Model):
    output: str
    path: str  # the path relative to the workspace
    truncated: bool = False


class SearchArgs(Model):
    query: str = Field(min_length=1)
    k: int = Field(default=5, ge=1, le=100)


class SearchHit(Model):
    id: str
    title: str = ""
    text: str
    score: float


class SearchResult(Model):
    hits: list[SearchHit]


TOOLS: dict[str, tuple[Any, type[Model]]] = {
    "ping": (PingArgs, PingResult),
    "shutdown": (ShutdownArgs, ShutdownResult),
    "bash": (BashArgs, BashResult),
    "ipython": (IPythonArgs, IPythonResult),
    "editor": (EditorArgs, EditorResult),
    "search": (SearchArgs, SearchResult),
}
_ADAPTERS: dict[str, TypeAdapter] = {}


def args_adapter(tool: str) -> TypeAdapter:
    """The validator of ``tool``'s arguments (KeyError for an unknown tool)."""
    if tool not in _ADAPTERS:
        _ADAPTERS[tool] = TypeAdapter(TOOLS[tool][0])
    return _ADAPTERS[tool]


def result_model(tool: str) -> type[Model]:
    return TOOLS[tool][1]


def ok_body(request_id: int | str, result: BaseModel) -> bytes:
    """The JSON of a successful :class:`Response` (built without a dict round trip)."""
    return b'{"id":%s,"ok":true,"result":%s}' % (
        json.dumps(request_id).encode(),
        result.model_dump_json().encode(),
    )


def error_body(request_id: int | str | None, code: str, message: str) -> bytes:
    """The JSON of an error :class:`Response`."""
    error = {"id": request_id, "ok": False, "error": {"code": code, "message": message}}
    return json.dumps(error, separators=(",", ":")).encode()


# -- framing ------------------------------------------------------------------------------------


class FrameError(ValueError):
    """A frame that cannot be read: too large, or not a JSON object."""


def frame(body: bytes) -> bytes:
    """One frame: the 4-byte big-endian length of ``body``, then ``body``."""
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the limit of {MAX_FRAME}")
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def encode(message: dict[str, Any] | BaseModel) -> bytes:
    """A message (a dict, or a model without its unset optional fields) as one frame."""
    if isinstance(message, BaseModel):
        message = {k: v for k, v in message.model_dump(mode="json").items() if v is not None}
    return frame(json.dumps(message, separators=(",", ":")).encode())


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The body of the next frame, or None at a clean end of stream (between frames).

    Raises :class:`FrameError` for a frame over the limit, ``asyncio.IncompleteReadError``
    when the stream ends inside a frame.
    """
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME}")
    return await reader.readexactly(size)
