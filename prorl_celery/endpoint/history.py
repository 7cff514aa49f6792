"""Exact ids for an agent that re-sends its whole history as text (the per-job OpenAI endpoint).

An OpenAI-compatible client sends every message of the conversation on every call. The
endpoint matches them against the turns it already served in the current segment of the job's
:class:`~prorl_celery.llm.session.TokenSession`:

* every earlier message must be the one the segment holds: system/user/tool messages by role
  and content, assistant messages by the text this endpoint returned for them (the content, the
  content after a ``<think>`` block, or the model's whole decoded text) and their tool calls;
* the messages after the last served turn are new observations: only they are tokenized, as the
  chat template's suffix after the last model turn (``TokenSession.add_messages``); the matched
  turns keep the exact ids the model produced;
* when the history differs (the agent rewrote, dropped or inserted a message, or changed the
  tools), or when the template would render the earlier turns differently once the new messages
  follow (Qwen3 drops the ``<think>`` blocks of turns before the last user message), the ids
  already served are no longer what a text-rendering server would send: the session starts a
  NEW segment from the template's rendering of the whole request, and records a drift event
  (which message, why, how many served ids the new segment does not reproduce). Nothing is ever
  re-tokenized in silence.

``/v1/completions`` works the same way on text (or ids): a prompt that extends the segment's
decoded ids is its suffix; any other prompt starts a new segment.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prorl_celery.llm.tokenizer import _PROBE, ChatTokenizer, _nth_end

_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_THINK_END = "</think>"
_OVERLAP = 8  # ids decoded again at the seam of an incremental decode (ChatMatcher.decoded)


class EndpointRequestError(ValueError):
    """A request the endpoint cannot serve (HTTP 400 with this message)."""


# -- template suffixes ----------------------------------------------------------------------------

def suffix_ids(tokenizer: ChatTokenizer, messages: list[dict[str, Any]],
               tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Ids the template appends after a model turn that ended with the end-of-turn token, for
    ``messages`` together (with the generation prompt), and where each message ends in them.

    As ``ChatTokenizer.observation_ids``: a fixed probe conversation is rendered with and without
    the messages and only the text after the probe's last end-of-turn token is kept. A message
    whose own rendering is not a token prefix shares the next message's end."""
    turns = tokenizer._probe_turns(tools)
    full = tokenizer.render(_PROBE + list(messages), tools, add_generation_prompt=True)
    cut = _nth_end(full, tokenizer.eot_token, turns)
    if turns == 0 or cut < 0:
        raise ValueError(f"chat template of {tokenizer.name!r} has no {tokenizer.eot_token!r} after a turn")
    ids = tokenizer.encode(full[cut:])
    ends: list[int] = []
    for count in range(1, len(messages)):
        part = tokenizer.render(_PROBE + list(messages[:count]), tools)
        head = tokenizer.encode(part[cut:]) if part[:cut] == full[:cut] else None
        ends.append(len(head) if head is not None and ids[:len(head)] == head else -1)
    ends.append(len(ids))
    for index in range(len(ends) - 2, -1, -1):
        if ends[index] < 0 or ends[index] > ends[index + 1]:
            ends[index] = ends[index + 1]
    return ids, ends


# -- the OpenAI shapes ------------------------------------------------------------------------------

def content_text(content: Any, where: str) -> str:
    """A message's content as one string (text parts joined); other parts are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise EndpointRequestError(f"{where}: content part of type {kind!r} is not supported (text only)")
        return "".join(texts)
    raise EndpointRequestError(f"{where}: content must be a string or a list of text parts")


def _arguments(value: Any) -> Any:
    """Tool-call arguments as an object (OpenAI sends a JSON string; templates want the object)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value if value is not None else {}


@dataclass(frozen=True)
class Message:
    """One request message, normalised."""

    role: str
    content: str
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, canonical JSON of the arguments)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    raw_tool_calls: tuple[dict[str, Any], ...] = ()

    @classmethod
    def parse(cls, value: Any, index: int) -> Message:
        where = f"messages[{index}]"
        if not isinstance(value, dict):
            raise EndpointRequestError(f"{where} must be an object")
        role = value.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise EndpointRequestError(f"{where}.role must be system, developer, user, assistant or tool")
        calls, raw = [], []
        for call in value.get("tool_calls") or ():
            function = (call or {}).get("function") or {}
            if not isinstance(function.get("name"), str):
                raise EndpointRequestError(f"{where}.tool_calls: every call needs function.name")
            arguments = _arguments(function.get("arguments"))
            calls.append((function["name"], json.dumps(arguments, sort_keys=True)))
            raw.append({"name": function["name"], "arguments": arguments})
        reasoning = value.get("reasoning_content") or value.get("reasoning")
        return cls(role=role, content=content_text(value.get("content"), where), tool_calls=tuple(calls),
                   tool_call_id=value.get("tool_call_id"), name=value.get("name"),
                   reasoning=reasoning if isinstance(reasoning, str) else None, raw_tool_calls=tuple(raw))

    @classmethod
    def assistant(cls, content: str, calls: Sequence[tuple[str, Any]] = (), reasoning: str | None = None) -> Message:
        """An assistant turn from another API's shape: its text, (name, arguments) calls, reasoning."""
        arguments = [(name, _arguments(args)) for name, args in calls]
        return cls(role="assistant", content=content,
                   tool_calls=tuple((name, json.dumps(args, sort_keys=True)) for name, args in arguments),
                   reasoning=reasoning or None,
                   raw_tool_calls=tuple({"name": name, "arguments": args} for name, args in arguments))

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (tool-call arguments as objects)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.raw_tool_calls:
            message["tool_calls"] = [{"type": "function", "function": dict(call)} for call in self.raw_tool_calls]
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name:
            message["name"] = self.name
        return message


@dataclass(frozen=True)
class Reply:
    """One model turn in OpenAI's terms: what the endpoint returns, and what it accepts back."""

    raw: str  # the model's whole decoded text (what the session holds)
    content: str | None
    reasoning: str | None
    tool_calls: tuple[dict[str, Any], ...]  # {"id", "name", "arguments" (object)}
    finish_reason: str
    stop_sequence: str | None = None  # the agent's stop sequence the text was cut at

    @classmethod
    def parse(cls, raw: str, *, tools_given: bool, finish: str, stop: Sequence[str] = ()) -> Reply:
        """The turn as an agent sees it; with ``stop``, its text (after any ``<think>`` block)
        ends before the first stop sequence, as a server that stopped there would have sent it
        (the session keeps every id the model generated)."""
        reasoning, rest = None, raw
        if _THINK_END in raw:
            head, rest = raw.split(_THINK_END, 1)
            reasoning = head.replace("<think>", "", 1).strip("\n")
            rest = rest.lstrip("\n")
        stop_sequence = None
        found = [(rest.find(s), s) for s in stop if s and s in rest]
        if found:
            at, stop_sequence = min(found)
            rest = rest[:at]
        calls: list[dict[str, Any]] = []
        content = rest
        if tools_given and "<tool_call>" in rest:
            parsed: list[dict[str, Any]] | None = []
            for body in _CALL_BLOCK.findall(rest):
                try:
                    payload = json.loads(body.strip())
                except json.JSONDecodeError:
                    parsed = None
                    break
                if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                    parsed = None
                    break
                assert parsed is not None  # every path that sets it to None breaks out of the loop
                parsed.append({"id": f"call_{uuid.uuid4().hex[:24]}", "name": payload["name"],
                               "arguments": _arguments(payload.get("arguments", {}))})
            if parsed:  # like vLLM's hermes parser: a malformed block leaves the text as content
                calls = parsed
                content = _CALL_BLOCK.sub("", rest).strip()
        reason = "length" if finish == "length" and stop_sequence is None else ("tool_calls" if calls else "stop")
        return cls(raw=raw, content=content if content or not calls else None, reasoning=reasoning,
                   tool_calls=tuple(calls), finish_reason=reason, stop_sequence=stop_sequence)

    def accepts(self, message: Message) -> bool:
        """Is ``message`` this turn as an agent sends it back?"""
        if message.role != "assistant":
            return False
        text = message.content.strip()
        if text == self.raw.strip():
            return True  # the model's text as is (tool-call blocks and <think> included)
        if text not in {(self.content or "").strip(), self.raw.split(_THINK_END, 1)[-1].strip()}:
            return False
        mine = tuple((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in self.tool_calls)
        return message.tool_calls == mine

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        return [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in self.tool_calls]


# -- the matching -----------------------------------------------------------------------------------

@dataclass
class Plan:
    """What one request does to the session: start, extend, or start a new segment."""

    action: str  # "start" | "extend" | "new_segment"
    messages: list[dict[str, Any]]  # start/new_segment: the whole conversation; extend: the new ones
    drift: dict[str, Any] | None = None


@dataclass
class ChatMatcher:
    """Per segment: the messages the session holds (as parsed requests saw them) and the replies."""

    tokenizer: ChatTokenizer
    held: list[Message | Reply] = field(default_factory=list)
    tools: list[dict] | None = None
    kind: str | None = None  # "chat" | "completion" once the segment has started

    #: the ids last decoded for the prefix check and their text: a segment's ids only grow, so
    #: the next check decodes only what was added (decoding 20k ids cost 9 ms a call)
    _decoded_ids: list[int] = field(default_factory=list)
    _decoded_text: str = ""

    def reset(self) -> None:
        self.held, self.tools, self.kind = [], None, None

    def decoded(self, ids: list[int]) -> str:
        """``tokenizer.decode(ids, False)``, reusing the last call's text when ``ids`` extend its ids.

        The last :data:`_OVERLAP` ids already decoded are decoded again with the new ones, and
        the cached text is used only when it ends with their text alone: a character split
        across ids, or a decoder that drops a leading space, then falls back to decoding all."""
        n = len(self._decoded_ids)
        text: str | None = None
        if n > _OVERLAP and len(ids) >= n and ids[:n] == self._decoded_ids:
            window = self.tokenizer.decode(ids[n - _OVERLAP:n], False)
            if "\ufffd" not in window and self._decoded_text.endswith(window):
                text = self._decoded_text[:len(self._decoded_text) - len(window)] + \
                    self.tokenizer.decode(ids[n - _OVERLAP:], False)
        if text is None:
            text = self.tokenizer.decode(ids, False)
        self._decoded_ids, self._decoded_text = list(ids), text
        return text

    def plan(self, messages: list[Message], tools: list[dict] | None, context_ids: Sequence[int] = (),
             spans: Sequence[tuple[int, int]] = ()) -> Plan:
        """What to do with a request, given the ids the segment holds and each message's span."""
        if not messages:
            raise EndpointRequestError("messages must not be empty")
        if self.kind is None:
            return Plan("start", self._render_list(messages))
        if self.kind != "chat":
            return self._drift(messages, None, "the agent switched from /v1/completions to /v1/chat/completions")
        if _canonical(tools) != _canonical(self.tools):
            return self._drift(messages, None, "the tools differ from the ones this segment was rendered with")
        for index, held in enumerate(self.held):
            if index >= len(messages):
                return self._drift(messages, index, f"the history is shorter than the {len(self.held)} "
                                   f"messages already served: message {index} onwards was dropped")
            sent = messages[index]
            if isinstance(held, Reply):
                if not held.accepts(sent):
                    return self._drift(messages, index, f"assistant message {index} is not the text this endpoint "
                                       f"returned for it" if sent.role == "assistant" else
                                       f"message {index} is a {sent.role} message where the assistant turn was")
            elif not _same(held, sent):
                what = "role" if held.role != sent.role else "content"
                return self._drift(messages, index, f"message {index} ({held.role}) was rewritten: its {what} "
                                   f"differs from what was served")
        new = messages[len(self.held):]
        if not new and self.held and not isinstance(self.held[-1], Reply):
            return Plan("extend", [])  # the last call failed before a reply: generate again
        if not new:
            return self._drift(messages, len(messages) - 1, "the request re-sends the history without a new "
                               "message (a retry): the served turn is generated again")
        if any(m.role == "assistant" for m in new):
            first = next(i for i, m in enumerate(new) if m.role == "assistant") + len(self.held)
            return self._drift(messages, first, f"assistant message {first} was not generated by this endpoint")
        rendered = [m.for_template() for m in new]
        problem = self._not_prefix_preserving(rendered, tools, list(context_ids), list(spans))
        if problem is not None:
            index, why = problem
            return self._drift(messages, index, why)
        return Plan("extend", rendered)

    def held_prefix(self, messages: list[Message]) -> int:
        """How many of the held messages ``messages`` repeats, from the first on (the tests
        :meth:`plan` makes, without rendering anything)."""
        for index, held in enumerate(self.held):
            if index >= len(messages):
                return index
            sent = messages[index]
            if not (held.accepts(sent) if isinstance(held, Reply) else _same(held, sent)):
                return index
        return len(self.held)

    def replies_carried(self, messages: list[Message]) -> int:
        """How many of the model turns served in this segment ``messages`` carries, anywhere."""
        sent = [m for m in messages if m.role == "assistant"]
        return sum(1 for held in self.held if isinstance(held, Reply) and any(held.accepts(m) for m in sent))

    def _render_list(self, messages: list[Message]) -> list[dict[str, Any]]:
        """Template messages for a new segment: served assistant turns as the model wrote them."""
        out = []
        for index, message in enumerate(messages):
            held = self.held[index] if index < len(self.held) else None
            if isinstance(held, Reply) and held.accepts(message):
                out.append({"role": "assistant", "content": held.raw})
            else:
                out.append(message.for_template())
        return out

    def _held_for_template(self) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": h.raw} if isinstance(h, Reply) else h.for_template()
                for h in self.held]

    def _not_prefix_preserving(self, new: list[dict[str, Any]], tools: list[dict] | None,
                               context_ids: list[int], spans: list[tuple[int, int]]) -> tuple[int, str] | None:
        """(message index, why) when a server rendering the whole request as text would not send
        the ids the segment holds, else None.

        The held ids decode to the text the backend saw; the template's rendering of the held
        turns plus ``new`` must start with that text (a turn ``max_tokens`` cut off included)."""
        held_text = self.decoded(context_ids)
        after = self.tokenizer.render(self._held_for_template() + new, tools, add_generation_prompt=True)
        if after.startswith(held_text):
            return None
        # the longest run of held ids whose text the rendering keeps, then the message holding it
        low, high = 0, len(context_ids)
        while low < high:
            mid = (low + high + 1) // 2
            if after.startswith(self.tokenizer.decode(context_ids[:mid], False)):
                low = mid
            else:
                high = mid - 1
        index = next((i for i, (a, b) in enumerate(spans) if a <= low < b), len(spans) - 1)
        index = min(index, len(self.held) - 1)
        turn = self.held[index]
        if isinstance(turn, Reply) and turn.reasoning and turn.reasoning.strip() not in after:
            why = (f"the chat template drops the <think> block of assistant message {index} once a later "
                   f"user message follows (it is not prefix-preserving)")
        else:
            why = (f"the chat template renders message {index} differently once the new messages follow "
                   f"(it is not prefix-preserving)")
        return index, why

    def _drift(self, messages: list[Message], index: int | None, why: str) -> Plan:
        return Plan("new_segment", self._render_list(messages), {"message": index, "reason": why})

    def observed(self, plan: Plan, parsed: list[Message], tools: list[dict] | None) -> None:
        """Record the messages the session holds once ``plan`` is applied (before generating)."""
        if plan.action == "extend":
            self.held += parsed[len(self.held):]
            return
        old = self.held
        held: list[Message | Reply] = []
        for i, message in enumerate(parsed):  # a served turn sent back as it was stays the Reply
            previous = old[i] if i < len(old) else None
            held.append(previous if isinstance(previous, Reply) and previous.accepts(message) else message)
        self.held = held
        self.tools, self.kind = tools, "chat"

    def replied(self, reply: Reply) -> None:
        self.held.append(reply)


def _same(held: Message, sent: Message) -> bool:
    if held.role != sent.role or held.content != sent.content:
        return False
    if held.tool_calls != sent.tool_calls:
        return False
    return not (held.tool_call_id and sent.tool_call_id and held.tool_call_id != sent.tool_call_id)


def _canonical(tools: list[dict] | None) -> str:
    return json.dumps(tools or None, sort_keys=True)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
