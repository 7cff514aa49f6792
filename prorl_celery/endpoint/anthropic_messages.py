"""Anthropic's Messages API on the per-job endpoint (``POST /v1/messages``), for Claude Code
and any ``anthropic`` SDK program.

A translation only: the request becomes the chat messages and OpenAI-shaped tools the chat
template takes, the turn is served by :meth:`AgentEndpoint.converse` (the same token session,
history matching and limits as ``/v1/chat/completions``), and the parsed reply goes back as
content blocks (``thinking``, ``text``, ``tool_use``).

Request to chat messages:

* ``system`` (a string or text blocks, joined by a blank line): one system message; Claude
  Code's attribution block (``x-anthropic-billing-header: ...``, new on every request) is dropped;
* a user message's ``text`` blocks: one user message (joined by a blank line); each
  ``tool_result`` block: a tool message (its text; ``is_error`` is not rendered), in the order
  the blocks come;
* an assistant message's ``text`` blocks (its content), ``thinking`` blocks (its reasoning) and
  ``tool_use`` blocks (its tool calls); ``redacted_thinking`` is dropped;
* ``tools`` (custom tools: ``name``, ``description``, ``input_schema``) as function tools;
  Anthropic-defined tools (``web_search_...``, ``bash_...``) and image/document blocks are
  refused (400), since the policy cannot run them.

Honoured: ``max_tokens`` (never above the job's), ``stop_sequences`` (the text ends before the
first one, ``stop_reason: stop_sequence``), ``tool_choice: none`` (no tool calls parsed),
``stream``. Accepted without effect: ``metadata``, ``tool_choice`` ``auto``/``any``/``tool``
(the model decides); every other key (``temperature``, ``thinking``, ...) is listed in the
result's ``endpoint.ignored_request_params``: the job's sampling rules.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prorl_celery.endpoint.history import EndpointRequestError, Message, Reply

if TYPE_CHECKING:
    from prorl_celery.endpoint.app import AgentEndpoint, Turn

OBEYED = frozenset({"model", "messages", "system", "tools", "tool_choice", "stop_sequences", "max_tokens",
                    "stream", "metadata"})
#: Anthropic's error type for each status the endpoint answers with
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 500: "api_error", 502: "api_error"}
_SEP = "\n\n"
#: Claude Code (2.1.36 on) puts ``x-anthropic-billing-header: cc_version=...; cch=<hash>;`` first in
#: ``system``, its hash new on every request: Anthropic's server consumes it, so does this one
#: (kept, the system message would differ on every call and each call start a new segment)
BILLING_BLOCK = "x-anthropic-billing-header:"


@dataclass
class MessagesRequest:
    """A Messages request as the shared session takes it."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    stop: list[str]
    model: str | None
    stream: bool


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return content
    raise EndpointRequestError(f"{where}: content must be a string or a list of content blocks")


def _text_of(content: Any, where: str) -> str:
    """Text blocks (or a string) as one string; any other block is refused."""
    if content is None:
        return ""
    texts = []
    for block in _blocks(content, where):
        if block.get("type") != "text":
            raise EndpointRequestError(f"{where}: a {block.get('type')!r} block is not supported (text only)")
        texts.append(str(block.get("text", "")))
    return _SEP.join(t for t in texts if t)


def to_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic custom tools as the OpenAI function tools chat templates render."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise EndpointRequestError("tools must be a list of objects")
    out = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise EndpointRequestError(f"tools[{index}]: the Anthropic-defined tool {kind!r} is not served here "
                                       f"(custom tools with an input_schema only)")
        if not isinstance(tool.get("name"), str):
            raise EndpointRequestError(f"tools[{index}]: name is required")
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def to_messages(body: dict[str, Any]) -> list[Message]:
    """``system`` and ``messages`` as chat messages (see the module's docstring)."""
    out: list[Message] = []
    system = body.get("system")
    if isinstance(system, list):  # Claude Code's per-request attribution block is not the prompt
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_BLOCK))]
    if system:
        out.append(Message(role="system", content=_text_of(system, "system")))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise EndpointRequestError("messages must be a non-empty list")
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise EndpointRequestError(f"{where} must be an object")
        role = message.get("role")
        blocks = _blocks(message.get("content"), where)
        if role == "user":
            out += _user(blocks, where)
        elif role == "assistant":
            out.append(_assistant(blocks, where))
        elif role == "system":  # Claude Code's mid-conversation system turns (environment, reminders)
            out.append(Message(role="system", content=_text_of(message.get("content"), where)))
        else:
            raise EndpointRequestError(f"{where}.role must be user, assistant or system")
    return out


def _user(blocks: list[dict[str, Any]], where: str) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(Message(role="user", content=_SEP.join(texts)))
            texts.clear()

    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                texts.append(str(block["text"]))
        elif kind == "tool_result":
            flush()
            out.append(Message(role="tool", content=_text_of(block.get("content"), f"{where} tool_result"),
                               tool_call_id=block.get("tool_use_id")))
        else:
            raise EndpointRequestError(f"{where}: a {kind!r} block is not supported in a user message "
                                       f"(text and tool_result only)")
    flush()
    return out


def _assistant(blocks: list[dict[str, Any]], where: str) -> Message:
    texts, thoughts, calls = [], [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise EndpointRequestError(f"{where}: a tool_use block needs a name")
            calls.append((block["name"], block.get("input") if block.get("input") is not None else {}))
        elif kind != "redacted_thinking":
            raise EndpointRequestError(f"{where}: a {kind!r} block is not supported in an assistant message")
    return Message.assistant(_SEP.join(t for t in texts if t), calls, _SEP.join(thoughts) or None)


def parse(body: dict[str, Any]) -> MessagesRequest:
    """Validate and translate a Messages request."""
    tools = to_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is not None and not (isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none")):
        raise EndpointRequestError("tool_choice must be an object whose type is auto, any, tool or none")
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise EndpointRequestError("stop_sequences must be a list of strings")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0):
        raise EndpointRequestError("max_tokens must be a positive integer")
    model = body.get("model")
    return MessagesRequest(messages=to_messages(body), tools=tools,
                           parse_tools=bool(tools) and (choice or {}).get("type") != "none",
                           stop=list(stop or ()), model=model if isinstance(model, str) else None,
                           stream=bool(body.get("stream")))


# -- the answer ---------------------------------------------------------------------------------------

def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def signature(reasoning: str) -> str:
    """An opaque signature for a thinking block (clients send it back; nothing checks it)."""
    return "prorl-" + hashlib.sha256(reasoning.encode()).hexdigest()[:32]


def content_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": signature(reply.reasoning)})
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        blocks.append({"type": "tool_use", "id": _tool_id(call["id"]), "name": call["name"],
                       "input": call["arguments"]})
    return blocks


def stop_reason(reply: Reply) -> str:
    if reply.stop_sequence is not None:
        return "stop_sequence"
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(reply.finish_reason, "end_turn")


def response(turn: Turn, model: str) -> dict[str, Any]:
    """The ``message`` object of one served turn."""
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(turn.reply), "stop_reason": stop_reason(turn.reply),
            "stop_sequence": turn.reply.stop_sequence,
            "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": len(turn.generation.token_ids),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of one finished message, in Anthropic's order: ``message_start``, per block
    ``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` (a ``ping`` after
    the first start), ``message_delta`` (stop reason, output tokens), ``message_stop``."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        opened: dict[str, Any]
        if kind == "text":
            opened, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": opened}))
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                   for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if not message["content"]:
        events.append(("ping", {"type": "ping"}))
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"],
                                               "stop_sequence": message["stop_sequence"]},
                                     "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error JSON (the SDKs read ``error.type`` and ``error.message``)."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": f"req_{uuid.uuid4().hex[:24]}"}


# -- the calls ----------------------------------------------------------------------------------------

async def create(endpoint: AgentEndpoint, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One ``POST /v1/messages``: (the message, whether the agent asked for a stream)."""
    endpoint._admit()
    request = parse(body)
    overrides = endpoint._overrides(body, OBEYED, caps=("max_tokens",))
    from prorl_celery.endpoint.app import EndpointRefused  # the module that serves this one

    try:
        turn = await endpoint.converse(request.messages, request.tools, parse_tools=request.parse_tools,
                                       overrides=overrides, kind="messages", model=request.model, stop=request.stop)
    except EndpointRefused as refusal:
        if refusal.code == "context_length_exceeded":  # Anthropic's words: Claude Code looks for them
            session = endpoint.session
            refusal.message = (f"prompt is too long: {len(session.context_ids)} tokens > {session.max_model_len} "
                               f"maximum ({refusal.message})")
        raise
    return response(turn, request.model or endpoint.model), request.stream


def count_tokens(endpoint: AgentEndpoint, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/messages/count_tokens``: the template's token count of the request (not a call)."""
    request = parse(body)
    return {"input_tokens": endpoint.count_tokens(request.messages, request.tools)}
