"""OpenAI's Responses API on the per-job endpoint (``POST /v1/responses``), for Codex CLI (whose
current versions speak only this API) and any ``client.responses.create`` program.

A translation only, like :mod:`.anthropic_messages`: input items become chat messages, the turn
is served by :meth:`AgentEndpoint.converse` (the same token session, history matching and
limits as chat), and the parsed reply goes back as output items.

Input items to chat messages:

* ``instructions``: a system message first (not carried over from a previous response, as the
  API defines); ``message`` items by role (``developer`` is ``system``; text parts only);
* consecutive ``reasoning``, assistant ``message``, ``function_call`` and ``custom_tool_call``
  items: ONE assistant turn (its reasoning, text and calls), as this endpoint answered it;
* ``function_call_output`` / ``custom_tool_call_output``: a tool message for its ``call_id``;
* ``previous_response_id``: the stored response's whole input and output come first. Every
  response is kept for the job (``store: false`` keeps it out), at most :data:`STORED`.

Tools: ``function`` tools as they are; ``custom`` tools (Codex's freeform ``apply_patch``) as a
function of one string argument ``input``, answered as ``custom_tool_call`` items. Hosted tools
(``web_search``, ``file_search``, ``code_interpreter``, ``image_generation``, ``mcp``, ...) are
dropped and listed as ignored: the policy cannot call them. ``local_shell`` is refused (400):
give the model a function tool instead.

Honoured: ``max_output_tokens`` (never above the job's), ``tool_choice: none``, ``stream``,
``store``, ``previous_response_id``. Accepted without effect: ``include``,
``parallel_tool_calls`` (every call the model writes is returned), ``prompt_cache_key``,
``metadata``, ``tool_choice`` ``auto``/``required``/a named tool. Everything else
(``reasoning``, ``temperature``, ``text``, ...) is listed in ``endpoint.ignored_request_params``.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prorl_celery.endpoint.history import EndpointRequestError, Message, Reply, content_text

if TYPE_CHECKING:
    from prorl_celery.endpoint.app import AgentEndpoint, Turn

OBEYED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "stream", "store",
                    "previous_response_id", "max_output_tokens", "include", "parallel_tool_calls",
                    "prompt_cache_key", "metadata"})
HOSTED_TOOLS = ("web_search", "file_search", "code_interpreter", "image_generation", "mcp", "computer",
                "tool_search", "namespace")
#: responses a job keeps for ``previous_response_id`` (the oldest is dropped first)
STORED = 64
_ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")


@dataclass
class ResponsesRequest:
    """A Responses request as the shared session takes it."""

    messages: list[Message]
    items: list[dict[str, Any]]  # the whole conversation's items (previous response's included)
    tools: list[dict[str, Any]] | None
    custom_tools: frozenset[str]
    parse_tools: bool
    model: str | None
    stream: bool
    ignored: set[str] = field(default_factory=set)


class ResponseStore:
    """The job's served responses, for ``previous_response_id`` and ``GET /v1/responses/{id}``."""

    def __init__(self, size: int = STORED) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, response: dict[str, Any], items: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = (response, items)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def response(self, response_id: str) -> dict[str, Any] | None:
        entry = self._items.get(response_id)
        return entry[0] if entry else None

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """The input and output items of a stored response (what a follow-up continues)."""
        entry = self._items.get(response_id)
        if entry is None:
            raise EndpointRequestError(f"previous_response_id {response_id!r} is not a stored response of this job "
                                       f"(responses created with store: false are not kept)")
        return list(entry[1]) + list(entry[0]["output"])


def to_tools(tools: Any) -> tuple[list[dict[str, Any]] | None, frozenset[str], set[str]]:
    """(function tools for the template, names of custom tools, hosted tools dropped)."""
    if tools is None or tools == []:
        return None, frozenset(), set()
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise EndpointRequestError("tools must be a list of objects")
    out, custom, dropped = [], set(), set()
    for index, tool in enumerate(tools):
        kind = str(tool.get("type", ""))
        if kind in ("function", "custom"):
            if not isinstance(tool.get("name"), str):
                raise EndpointRequestError(f"tools[{index}]: name is required")
            function: dict[str, Any] = {"name": tool["name"]}
            if tool.get("description"):
                function["description"] = tool["description"]
            if kind == "function":
                function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            else:
                custom.add(tool["name"])
                function["parameters"] = {"type": "object", "properties": {"input": {
                    "type": "string", "description": "the tool's whole input, as free text"}}, "required": ["input"]}
            out.append({"type": "function", "function": function})
        elif kind.startswith(HOSTED_TOOLS):
            dropped.add(f"tools.{kind}")
        else:
            raise EndpointRequestError(f"tools[{index}]: a {kind!r} tool is not served here (function and custom "
                                       f"tools only; give the model a function tool for a shell)")
    return out or None, frozenset(custom), dropped


def _output_text(value: Any, where: str) -> str:
    """A call output: a string, or text parts."""
    return value if isinstance(value, str) else content_text(value, where)


def to_messages(items: list[dict[str, Any]], instructions: str | None) -> list[Message]:
    """Input items as chat messages (see the module's docstring)."""
    out: list[Message] = []
    if instructions:
        out.append(Message(role="system", content=instructions))
    turn: dict[str, Any] | None = None  # the assistant turn being gathered

    def close() -> None:
        nonlocal turn
        if turn is not None:
            out.append(Message.assistant("".join(turn["texts"]), turn["calls"], "\n".join(turn["reasoning"]) or None))
            turn = None

    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise EndpointRequestError(f"{where} must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind in _ASSISTANT_ITEMS or (kind == "message" and role == "assistant"):
            turn = turn or {"texts": [], "calls": [], "reasoning": []}
            if kind == "message":
                turn["texts"].append(content_text(item.get("content"), where))
            elif kind == "reasoning":
                parts = item.get("content") or item.get("summary") or []
                turn["reasoning"].append("\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)))
            elif kind == "function_call":
                turn["calls"].append((_name(item, where), item.get("arguments") or "{}"))
            else:
                turn["calls"].append((_name(item, where), {"input": str(item.get("input", ""))}))
            continue
        close()
        if kind == "message":
            if role not in ("user", "system", "developer"):
                raise EndpointRequestError(f"{where}.role must be user, system, developer or assistant")
            out.append(Message(role="user" if role == "user" else "system",
                               content=content_text(item.get("content"), where)))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(Message(role="tool", content=_output_text(item.get("output", ""), where),
                               tool_call_id=item.get("call_id")))
        else:
            raise EndpointRequestError(f"{where}: input items of type {kind!r} are not supported (message, "
                                       f"reasoning, function_call(_output), custom_tool_call(_output))")
    close()
    return out


def _name(item: dict[str, Any], where: str) -> str:
    if not isinstance(item.get("name"), str):
        raise EndpointRequestError(f"{where}: a call item needs a name")
    return item["name"]


def parse(body: dict[str, Any], store: ResponseStore) -> ResponsesRequest:
    """Validate and translate a Responses request (``store`` resolves ``previous_response_id``)."""
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": raw}]
    elif isinstance(raw, list):
        items = list(raw)
    else:
        raise EndpointRequestError("input must be a string or a list of items")
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise EndpointRequestError("previous_response_id must be a string")
        items = store.history(previous) + items
    if not items:
        raise EndpointRequestError("input must not be empty")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise EndpointRequestError("instructions must be a string")
    tools, custom, dropped = to_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none", "required") and not isinstance(choice, dict):
        raise EndpointRequestError("tool_choice must be auto, none, required or an object")
    cap = body.get("max_output_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise EndpointRequestError("max_output_tokens must be a positive integer")
    model = body.get("model")
    return ResponsesRequest(messages=to_messages(items, instructions), items=items, tools=tools, custom_tools=custom,
                            parse_tools=bool(tools) and choice != "none",
                            model=model if isinstance(model, str) else None, stream=bool(body.get("stream")),
                            ignored=dropped)


# -- the answer ---------------------------------------------------------------------------------------

def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(reply: Reply, custom_tools: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        items.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": reply.reasoning}], "status": status})
    if reply.content:
        items.append({"type": "message", "id": _id("msg"), "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}]})
    for call in reply.tool_calls:
        arguments = call["arguments"]
        if call["name"] in custom_tools:
            text = arguments.get("input") if isinstance(arguments, dict) else None
            items.append({"type": "custom_tool_call", "id": _id("ctc"), "call_id": call["id"], "name": call["name"],
                          "input": text if isinstance(text, str) else json.dumps(arguments), "status": "completed"})
        else:
            items.append({"type": "function_call", "id": _id("fc"), "call_id": call["id"], "name": call["name"],
                          "arguments": json.dumps(arguments), "status": "completed"})
    return items


def new_id() -> str:
    return _id("resp")


def pending(response_id: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    """The response being generated, as ``response.created`` shows it before the turn is done."""
    named = body.get("model")
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "model": named if isinstance(named, str) else model, "output": [], "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [], "usage": None}


def keepalive_events(started: dict[str, Any], *, first: bool, number: int) -> list[tuple[str, dict[str, Any]]]:
    """What a stream sends while its turn is generated, numbered from ``number``:
    ``response.created`` and ``response.in_progress`` first, then ``response.in_progress`` again."""
    kinds = ["response.created", "response.in_progress"] if first else ["response.in_progress"]
    return [(kind, {"type": kind, "sequence_number": number + i, "response": started}) for i, kind in enumerate(kinds)]


def failed_event(started: dict[str, Any], code: str, message: str, number: int) -> tuple[str, dict[str, Any]]:
    """``response.failed`` for a call refused after its stream started."""
    failed = {**started, "status": "failed", "error": {"code": code, "message": message}}
    return "response.failed", {"type": "response.failed", "sequence_number": number, "response": failed}


def response(turn: Turn, body: dict[str, Any], request: ResponsesRequest, model: str,
             response_id: str | None = None) -> dict[str, Any]:
    """The ``response`` object of one served turn."""
    incomplete = turn.reply.finish_reason == "length"
    output = len(turn.generation.token_ids)
    return {
        "id": response_id or new_id(), "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": model, "output": output_items(turn.reply, request.custom_tools),
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": body.get("previous_response_id"), "reasoning": body.get("reasoning"),
        "store": body.get("store", True) is not False, "temperature": None, "top_p": None,
        "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "truncation": "disabled", "metadata": body.get("metadata") or {},
        "prompt_cache_key": body.get("prompt_cache_key"), "user": None,
        "usage": {"input_tokens": turn.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": turn.prompt_tokens + output},
    }


def stream_events(done: dict[str, Any], *, skip_start: bool = False,
                  first_number: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of one finished response: ``response.created``, ``response.in_progress``,
    per output item ``response.output_item.added``, its content/argument deltas and dones,
    ``response.output_item.done``, then ``response.completed`` (``response.incomplete`` when cut
    at ``max_output_tokens``). Each carries a ``sequence_number``."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": first_number + len(events), **fields}))

    in_progress = {**done, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    if not skip_start:  # a stream that sent them while the turn was generated does not again
        emit("response.created", response=in_progress)
        emit("response.in_progress", response=in_progress)
    for index, item in enumerate(done["output"]):
        kind, at = item["type"], {"item_id": item["id"], "output_index": index}
        opened = {**item, "status": "in_progress", "content": []}
        if kind == "message":
            emit("response.output_item.added", output_index=index, item=opened)
            part = item["content"][0]
            emit("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            emit("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part=part)
        elif kind == "reasoning":
            emit("response.output_item.added", output_index=index, item=opened)
            part = item["content"][0]
            emit("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            emit("response.reasoning_text.delta", **at, content_index=0, delta=part["text"])
            emit("response.reasoning_text.done", **at, content_index=0, text=part["text"])
            emit("response.content_part.done", **at, content_index=0, part=part)
        elif kind == "function_call":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
            emit("response.function_call_arguments.done", **at, arguments=item["arguments"], name=item["name"])
        else:
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "input": ""})
            emit("response.custom_tool_call_input.delta", **at, delta=item["input"])
            emit("response.custom_tool_call_input.done", **at, input=item["input"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if done["status"] == "incomplete" else "response.completed", response=done)
    return events


# -- the calls ----------------------------------------------------------------------------------------

async def create(endpoint: AgentEndpoint, body: dict[str, Any],
                 response_id: str | None = None) -> tuple[dict[str, Any], bool]:
    """One ``POST /v1/responses``: (the response, whether the agent asked for a stream);
    ``response_id`` names it (a stream announced it before the turn was done)."""
    endpoint._admit()
    request = parse(body, endpoint.responses)
    endpoint.ignored_params |= request.ignored
    overrides = endpoint._overrides(body, OBEYED, caps=("max_output_tokens",))
    turn = await endpoint.converse(request.messages, request.tools, parse_tools=request.parse_tools,
                                   overrides=overrides, kind="responses", model=request.model)
    served = response(turn, body, request, request.model or endpoint.model, response_id)
    if body.get("store", True) is not False:
        endpoint.responses.put(served, request.items)
    return served, request.stream


def retrieve(endpoint: AgentEndpoint, response_id: str) -> dict[str, Any] | None:
    """``GET /v1/responses/{id}``: a stored response."""
    return endpoint.responses.response(response_id)
