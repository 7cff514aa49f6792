"""The per-job OpenAI-compatible endpoint: an agent program's LLM, token-exact underneath.

Served by the RUN worker process that runs the job, on the job's own event loop, attached to
the job's :class:`~prorl_celery.llm.session.TokenSession` (no state crosses processes). It
listens on a Unix socket in the sandbox's socket directory (``/run/toolserver/llm.sock``
inside), and a forwarder inside the sandbox (:mod:`singularity.toolserver.agentrun`) makes it
``http://127.0.0.1:<port>/v1`` for any program.

=======  =========================  ======================================================
method   path                       what
=======  =========================  ======================================================
POST     /v1/chat/completions       messages (+ tools) -> one model turn; ``stream: true``,
                                    ``logprobs``/``top_logprobs``, ``return_token_ids``
POST     /v1/completions            prompt text (or ids) -> one model turn; ``stream``, ``echo``
POST     /v1/messages               Anthropic Messages (:mod:`.anthropic_messages`); ``stream``
POST     /v1/messages/count_tokens  the template's token count of a Messages request
POST     /v1/responses              OpenAI Responses (:mod:`.responses_api`); ``stream``,
                                    ``previous_response_id``
GET      /v1/responses/{id}         a stored response
GET      /v1/models                 the served model name and context length
GET      /                          a reachability probe, HEAD too (no key needed, says nothing)
GET      /_prorl/control            long poll: answers when the job wants the program to end
=======  =========================  ======================================================

Every request needs the job's key (``Authorization: Bearer <key>``, ``x-api-key`` or
``api-key``); any other is a 401 (in Anthropic's error JSON on ``/v1/messages``). History is
matched against what was served (:mod:`.history`): matched turns keep their exact ids, new
messages are the template's suffix, and anything else starts a new segment with a drift event.
Limits: ``max_calls`` counts calls; the job's time budget and context length bound them; when
the endpoint closes (the job's RUN ended or it was cancelled) the call in flight is aborted at
once (its backend request is cancelled) and every later call is refused.

Refusals use status codes that OpenAI clients do not retry: 400 ``context_length_exceeded``;
403 for ``max_iterations``, ``time_budget`` and ``job_ended``; 401 for a wrong key.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handlers import EndpointRequest
from prorl_celery.core.errors import BackendError, ContextExhausted
from prorl_celery.endpoint import anthropic_messages, responses_api
from prorl_celery.endpoint.history import EndpointRequestError, Message, Reply, common_prefix
from prorl_celery.endpoint.samples import SampleRouter
from prorl_celery.llm.session import TokenSession
from singularity.toolserver.agentrun import ENDPOINT_INSIDE, ENDPOINT_SOCKET

log = logging.getLogger(__name__)

#: request keys an agent may send that the endpoint obeys (the job's sampling params rule the rest)
OBEYED = frozenset({"model", "messages", "tools", "tool_choice", "stream", "stream_options", "logprobs",
                    "top_logprobs", "max_tokens", "max_completion_tokens", "n", "prompt", "return_token_ids",
                    "echo", "stop"})
MAX_BODY_BYTES = 64 * 2**20
KEEPALIVE_S = 15.0


class EndpointRefused(Exception):
    """A call the endpoint answers with an OpenAI-shaped error."""

    def __init__(self, status: int, code: str, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.kind = status, code, message, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code, "param": None}}


@dataclass(frozen=True)
class Turn:
    """One served model turn: the parsed reply, the backend's generation, and the prompt's ids."""

    reply: Reply
    generation: Any  # handlers.base.Generation
    prompt_tokens: int
    prompt_ids: list[int]


class AgentEndpoint:
    """The endpoint's logic, independent of HTTP (tests drive it directly too)."""

    def __init__(self, session: TokenSession, *, key: str, model: str = "policy",
                 max_calls: int | None = None, time_left: Callable[[], float | None] | None = None,
                 auxiliary_models: Sequence[str] = ()) -> None:
        self.session, self.key, self.model = session, key, model
        self.max_calls = max_calls
        self.time_left = time_left or (lambda: None)
        self.router = SampleRouter(session, model, auxiliary_models)
        self.calls = 0
        self.refused: dict[str, int] = {}
        self.ignored_params: set[str] = set()
        self.call_log: list[dict[str, Any]] = []
        #: the Responses API's served responses, for ``previous_response_id``
        self.responses = responses_api.ResponseStore()
        #: a streamed Messages/Responses call whose turn takes longer than this starts its stream
        #: and sends a keepalive event this often (Codex drops a stream silent for 300 s)
        self.keepalive_s = KEEPALIVE_S
        self.closed: str | None = None
        self.stop_reason: str | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._inflight: set[asyncio.Task] = set()

    # -- auth, limits, life cycle -------------------------------------------------------------

    def authorized(self, headers: Any) -> bool:
        given = headers.get("authorization", "")
        token = (given[7:].strip() if given.lower().startswith("bearer ")
                 else headers.get("x-api-key") or headers.get("api-key", ""))  # Anthropic's, Azure's
        return bool(token) and hmac.compare_digest(token.encode(), self.key.encode())

    def request_stop(self, reason: str) -> None:
        """Ask the agent program to end (the in-sandbox runner long-polls ``/_prorl/control``)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    async def wait_stop(self) -> str:
        await self._stop.wait()
        return self.stop_reason or self.closed or "stop"

    def close(self, reason: str = "the job's RUN stage ended") -> None:
        """Refuse every later call and abort the one in flight (its backend request is cancelled)."""
        if self.closed is None:
            self.closed = reason
        for task in list(self._inflight):
            task.cancel()
        self._stop.set()  # the in-sandbox runner ends the program, if it still runs

    def _admit(self) -> None:
        if self.closed is not None:
            raise self._refuse(403, "job_ended", f"this job's endpoint is closed: {self.closed}")
        if self.max_calls is not None and self.calls >= self.max_calls:
            self.request_stop("max_iterations")
            raise self._refuse(403, "max_iterations", f"the job allows {self.max_calls} LLM calls (max_iterations)")
        left = self.time_left()
        if left is not None and left <= 0:
            self.request_stop("time_budget")
            raise self._refuse(403, "time_budget", "the job's time budget is spent")

    def _refuse(self, status: int, code: str, message: str) -> EndpointRefused:
        self.refused[code] = self.refused.get(code, 0) + 1
        return EndpointRefused(status, code, message, "permission_denied" if status == 403 else "invalid_request_error")

    def summary(self) -> dict[str, Any]:
        """What the job's result records about the endpoint."""
        session = self.session
        events = session.drift_events
        samples = [{"sample": i, "origin": origin, "model": s.model, "parent": s.parent,
                    "turns": sum(1 for t in session.turns if t.get("sample") == i)}
                   for i, (s, origin) in enumerate(zip(session.sample_states, session.origins()))]
        return {"calls": self.calls, "segments": session.num_samples, "samples": samples,
                "drift_events": list(events),
                "drifted_tokens": sum(int(e.get("drifted_tokens", 0)) for e in events),
                "refused": dict(self.refused), "ignored_request_params": sorted(self.ignored_params),
                "calls_log": self.call_log, "stop_reason": self.stop_reason}

    # -- calls ----------------------------------------------------------------------------------

    def _overrides(self, body: dict[str, Any], obeyed: frozenset[str] | set[str] = OBEYED,
                   caps: tuple[str, ...] = ("max_completion_tokens", "max_tokens")) -> dict[str, Any]:
        """The sampling overrides an agent's request may make (a smaller ``max_tokens``), and
        every key of it the endpoint does not obey noted in ``ignored_params``."""
        self.ignored_params |= {k for k in body if k not in obeyed}
        if body.get("n", 1) not in (1, None):
            raise EndpointRequestError("n must be 1")
        cap = next((body[k] for k in caps if body.get(k) is not None), None)
        if cap is None:
            return {}
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise EndpointRequestError(f"{caps[-1]} must be a positive integer")
        return {"max_tokens": min(int(self.session.sampling["max_tokens"]), cap)}

    async def _generate(self, overrides: dict[str, Any]):
        task = asyncio.ensure_future(self.session.generate(**overrides))
        self._inflight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if self.closed is not None and task.cancelled():
                raise self._refuse(403, "job_ended", f"the call was aborted: {self.closed}") from None
            raise
        except ContextExhausted as error:
            self.request_stop("context")
            raise self._refuse(400, "context_length_exceeded", str(error)) from None
        except BackendError as error:
            raise EndpointRefused(502, "backend_error", str(error), "server_error") from None
        finally:
            self._inflight.discard(task)

    def _model_of(self, body: dict[str, Any]) -> str:
        """The model name a call asks for (the endpoint's own when it names none)."""
        model = body.get("model")
        if model is None or model == "":
            return self.model
        if not isinstance(model, str):
            raise EndpointRequestError("model must be a string")
        return model

    def _start_sample(self, model: str, parent: int | None, drift: dict[str, Any] | None,
                      start: Callable[[], None]) -> int:
        """A new sample, started by ``start``; a rewrite (``drift``) records what it kept of
        the ids its parent served."""
        session = self.session
        previous: list[int] = []
        if parent is not None:
            session.activate(parent)
            previous = session.context_ids
        index = session.new_sample(model=model, parent=parent,
                                   drift=None if drift is None else {**drift, "call": self.calls})
        start()
        if drift is not None:
            kept = common_prefix(previous, session.prompt_ids)
            session.drift_events[-1].update(kept_tokens=kept, drifted_tokens=len(previous) - kept)
            log.info("endpoint drift at call %d: %s", self.calls, drift.get("reason"))
        return index

    def _log_call(self, kind: str, action: str, started: float, context: int, generation: Any) -> None:
        session = self.session
        sample = session.sample_states[session.active]
        self.call_log.append({"call": self.calls, "kind": kind, "action": action, "segment": session.active,
                              "sample": session.active, "model": sample.model,
                              "prompt_tokens": context, "completion_tokens": len(generation.token_ids),
                              "seconds": round(time.monotonic() - started, 4)})

    async def converse(self, parsed: list[Message], tools: list[dict[str, Any]] | None, *,
                       parse_tools: bool, overrides: dict[str, Any], kind: str = "chat",
                       model: str | None = None, stop: Sequence[str] = ()) -> Turn:
        """One model turn of a conversation sent as chat messages, whatever API it came in.

        Every dialect (chat completions, Anthropic Messages, OpenAI Responses) translates its
        request to ``parsed`` (and tools in OpenAI's function shape, as chat templates take
        them) and its answer from the returned :class:`Turn`; the history matching, the session
        and the limits are this one method's."""
        self._admit()
        model = model or self.model
        async with self._lock:
            self._admit()
            self.calls += 1
            started = time.monotonic()
            session = self.session
            route = self.router.route_chat(parsed, tools, model)
            plan = route.plan
            if route.new:
                index = self._start_sample(model, route.parent,
                                           plan.drift if route.parent is not None else None,
                                           lambda: session.start(plan.messages, tools))
            else:
                assert route.index is not None
                index = route.index
                session.activate(index)
                if plan.messages:
                    session.add_messages(plan.messages)
            self.router.observed(index, plan, parsed, tools)
            context = len(session.context_ids)
            generation = await self._generate(overrides)
            reply = Reply.parse(generation.text, tools_given=parse_tools, finish=generation.finish_reason, stop=stop)
            self.router.replied(index, reply)
            self._log_call(kind, "extend" if not route.new else ("new_segment" if route.parent is not None
                                                                 else "start"), started, context, generation)
            prompt_ids = session.context_ids[:context]
        return Turn(reply, generation, context, prompt_ids)

    def count_tokens(self, parsed: list[Message], tools: list[dict[str, Any]] | None) -> int:
        """Tokens the chat template makes of a conversation (nothing is generated or kept)."""
        if not parsed:
            raise EndpointRequestError("messages must not be empty")
        return len(self.session.tokenizer.prompt_ids([m.for_template() for m in parsed], tools))

    async def chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], Reply, Any]:
        """One ``/v1/chat/completions`` call; returns (response, reply, generation)."""
        self._admit()
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list):
            raise EndpointRequestError("messages must be a list")
        parsed = [Message.parse(m, i) for i, m in enumerate(raw_messages)]
        if not parsed:
            raise EndpointRequestError("messages must not be empty")
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise EndpointRequestError("tools must be a list of objects")
        overrides = self._overrides(body)
        turn = await self.converse(parsed, tools, parse_tools=bool(tools) and body.get("tool_choice") != "none",
                                   overrides=overrides, model=self._model_of(body),
                                   stop=stop_strings(body.get("stop"), "stop"))
        response = self._chat_response(body, turn.reply, turn.generation, turn.prompt_tokens, turn.prompt_ids)
        return response, turn.reply, turn.generation

    async def completion(self, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """One ``/v1/completions`` call on text (or ids); returns (response, generation)."""
        self._admit()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        ids: list[int] | None = None
        text: str | None = None
        if isinstance(prompt, str):
            text = prompt
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            ids = list(prompt)
        else:
            raise EndpointRequestError("prompt must be one string or one list of token ids")
        echo = bool(body.get("echo"))
        if echo and body.get("logprobs") not in (None, False):
            raise EndpointRequestError("echo with logprobs is not served: the prompt's logprobs are not computed")
        overrides = self._overrides(body)
        model = self._model_of(body)
        tok = self.session.tokenizer
        async with self._lock:
            self._admit()
            self.calls += 1
            started = time.monotonic()
            session = self.session
            route = self.router.route_ids(ids, text, model)
            if route.index is not None and route.suffix is not None:
                action = "extend"
                session.activate(route.index)
                session.add_ids(route.suffix, tok.decode(route.suffix, False))
            else:
                first = ids if ids is not None else _encode_prompt(tok, text or "")
                drift = route.drift
                if drift is not None and route.parent is not None:
                    state = session.sample_states[route.parent]
                    drift = {**drift, "token": common_prefix(state.prompt_ids + state.response_ids, first)}
                action = "new_segment" if drift is not None else "start"
                index = self._start_sample(model, route.parent, drift, lambda: session.start_ids(
                    first, text if text is not None else tok.decode(first, False)))
                self.router.matcher(index).reset()
                self.router.matcher(index).kind = "completion"
            context = len(session.context_ids)
            generation = await self._generate(overrides)
            self._log_call("completion", action, started, context, generation)
        response = self._completion_response(body, generation, context, session.context_ids)
        if echo:  # the prompt as the agent sent it, then the completion (OpenAI's echo)
            choice = response["choices"][0]
            choice["text"] = (text if text is not None else tok.decode(ids or [], False)) + choice["text"]
        return response, generation

    # -- responses ------------------------------------------------------------------------------

    def _token_entries(self, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        tok = self.session.tokenizer
        entries = []
        for token_id, logprob in zip(ids, logprobs):
            text = tok.decode([token_id], False)
            entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")),
                            "top_logprobs": [{"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}]})
        return entries

    def _chat_response(self, body: dict[str, Any], reply: Reply, generation: Any, prompt_tokens: int,
                       context: list[int]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.openai_tool_calls()
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.finish_reason,
                                  "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._token_entries(generation.token_ids, generation.logprobs)}
        response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                    "model": self.model, "choices": [choice], "usage": _usage(prompt_tokens, generation)}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(generation.token_ids)
            response["prompt_token_ids"] = context[:prompt_tokens]
        return response

    def _completion_response(self, body: dict[str, Any], generation: Any, prompt_tokens: int,
                             context: list[int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": generation.text, "logprobs": None,
                                  "finish_reason": "length" if generation.finish_reason == "length" else "stop"}
        if body.get("logprobs") is not None and body.get("logprobs") is not False:
            entries = self._token_entries(generation.token_ids, generation.logprobs)
            offsets, at = [], 0
            for entry in entries:
                offsets.append(at)
                at += len(entry["token"])
            choice["logprobs"] = {"tokens": [e["token"] for e in entries],
                                  "token_logprobs": [e["logprob"] for e in entries],
                                  "top_logprobs": [{e["token"]: e["logprob"]} for e in entries], "text_offset": offsets}
        response = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                    "model": self.model, "choices": [choice], "usage": _usage(prompt_tokens, generation)}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(generation.token_ids)
            response["prompt_token_ids"] = context[:prompt_tokens]
        return response

    def models(self) -> dict[str, Any]:
        """The served model, in OpenAI's list shape and Anthropic's at once (Claude Code's model
        discovery reads ``type``, ``display_name``, ``has_more``; OpenAI clients ``object``)."""
        now = time.time()
        model = {"id": self.model, "object": "model", "created": int(now), "owned_by": "prorl",
                 "max_model_len": self.session.max_model_len, "type": "model", "display_name": self.model,
                 "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
        return {"object": "list", "data": [model], "has_more": False, "first_id": self.model, "last_id": self.model}


def stop_strings(value: Any, name: str) -> list[str]:
    """An agent's stop sequences (one string or a list of them)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise EndpointRequestError(f"{name} must be a string or a list of strings")


def _usage(prompt_tokens: int, generation: Any) -> dict[str, int]:
    completion = len(generation.token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _encode_prompt(tok: Any, text: str) -> list[int]:
    """A completions prompt as vLLM encodes it (the tokenizer's special tokens added)."""
    with tok._lock:
        return list(tok.hf.encode(text))


# -- streaming ----------------------------------------------------------------------------------------

def chat_chunks(response: dict[str, Any], reply: Reply, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of one finished turn."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning is not None:
        chunks.append(chunk({"reasoning_content": reply.reasoning}))
    if reply.content:
        extra = {"logprobs": choice["logprobs"]} if choice.get("logprobs") else {}
        chunks.append(chunk({"content": reply.content}, **extra))
    for index, call in enumerate(reply.openai_tool_calls()):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    final = chunk({}, reply.finish_reason)
    if "token_ids" in choice:
        final["choices"][0]["token_ids"] = choice["token_ids"]
    chunks.append(final)
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


def completion_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    base = {"id": response["id"], "object": "text_completion", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    chunks = [{**base, "choices": [{"index": 0, "text": choice["text"], "logprobs": choice["logprobs"],
                                    "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                    "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


# -- HTTP ---------------------------------------------------------------------------------------------

def create_app(endpoint: AgentEndpoint) -> Any:
    """The Starlette app of one job's endpoint."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(refusal: EndpointRefused, dialect: str = "openai") -> JSONResponse:
        body = (anthropic_messages.error_body(refusal.status, refusal.message) if dialect == "anthropic"
                else refusal.body())
        return JSONResponse(body, status_code=refusal.status)

    def unauthorized(dialect: str = "openai") -> JSONResponse:
        return error(EndpointRefused(401, "invalid_api_key", "a valid key for this job's endpoint is required",
                                     "authentication_error"), dialect)

    async def read(request: Request) -> dict[str, Any]:
        data = await request.body()
        if len(data) > MAX_BODY_BYTES:
            raise EndpointRequestError(f"the request body is over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(data or b"{}")
        except ValueError as problem:
            raise EndpointRequestError(f"the body is not JSON: {problem}") from None
        if not isinstance(body, dict):
            raise EndpointRequestError("the body must be a JSON object")
        return body

    def sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for item in chunks:
                yield f"data: {json.dumps(item)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    def named_sse(events: list[tuple[str, dict[str, Any]]]) -> StreamingResponse:
        """Anthropic's and the Responses API's streams: named events, no ``[DONE]``."""
        async def lines() -> AsyncIterator[bytes]:
            for name, data in events:
                yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        return StreamingResponse(lines(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    async def streamed(kind: str, body: dict[str, Any]) -> Any:
        """A streamed Messages or Responses call. A turn done within ``keepalive_s`` (every
        refusal is) answers as the non-streamed call would, status code included; a longer one
        starts its stream at once and sends a keepalive event every ``keepalive_s`` (Anthropic's
        ``ping``; the Responses API's ``response.created`` then ``response.in_progress``), and a
        refusal that comes later is an error event in the stream."""
        pending: dict[str, Any] | None = None
        if kind == "messages":
            task = asyncio.ensure_future(anthropic_messages.create(endpoint, body))
        else:
            response_id = responses_api.new_id()
            pending = responses_api.pending(response_id, body, endpoint.model)
            task = asyncio.ensure_future(responses_api.create(endpoint, body, response_id=response_id))

        def events_of(response: dict[str, Any], sent: int) -> list[tuple[str, dict[str, Any]]]:
            if kind == "messages":
                return anthropic_messages.stream_events(response)
            return responses_api.stream_events(response, skip_start=sent > 0, first_number=sent)

        await asyncio.wait({task}, timeout=endpoint.keepalive_s)
        if task.done():
            return named_sse(events_of(task.result()[0], 0))

        async def lines() -> AsyncIterator[bytes]:
            def event(name: str, data: dict[str, Any]) -> bytes:
                return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            sent = 0  # keepalive events so far
            try:
                while not task.done():
                    if pending is None:
                        yield event("ping", {"type": "ping"})
                        sent += 1
                    else:
                        for name, data in responses_api.keepalive_events(pending, first=not sent, number=sent):
                            yield event(name, data)
                            sent += 1
                    await asyncio.wait({task}, timeout=endpoint.keepalive_s)
                try:
                    response = task.result()[0]
                except EndpointRefused as refusal:
                    failed = refusal
                except (EndpointRequestError, ValueError) as problem:
                    failed = EndpointRefused(400, "invalid_request", str(problem))
                else:
                    for name, data in events_of(response, sent):
                        yield event(name, data)
                    return
                if pending is None:
                    yield event("error", anthropic_messages.error_body(failed.status, failed.message))
                else:
                    yield event(*responses_api.failed_event(pending, failed.code, failed.message, sent))
            finally:
                if not task.done():  # the agent went away: its call ends too
                    task.cancel()
        return StreamingResponse(lines(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    async def call(request: Request, kind: str) -> Any:
        dialect = "anthropic" if kind in ("messages", "count_tokens") else "openai"
        if not endpoint.authorized(request.headers):
            return unauthorized(dialect)
        try:
            body = await read(request)
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            if kind == "chat":
                response, reply, _ = await endpoint.chat(body)
                if body.get("stream"):
                    return sse(chat_chunks(response, reply, include_usage))
            elif kind == "completion":
                response, _ = await endpoint.completion(body)
                if body.get("stream"):
                    return sse(completion_chunks(response, include_usage))
            elif kind == "count_tokens":
                response = anthropic_messages.count_tokens(endpoint, body)
            elif body.get("stream"):
                return await streamed(kind, body)
            elif kind == "messages":
                response, _ = await anthropic_messages.create(endpoint, body)
            else:
                response, _ = await responses_api.create(endpoint, body)
            return JSONResponse(response)
        except EndpointRefused as refusal:
            return error(refusal, dialect)
        except (EndpointRequestError, ValueError) as problem:
            return error(EndpointRefused(400, "invalid_request", str(problem)), dialect)

    async def chat(request: Request) -> Any:
        return await call(request, "chat")

    async def completions(request: Request) -> Any:
        return await call(request, "completion")

    async def messages(request: Request) -> Any:
        return await call(request, "messages")

    async def count_tokens(request: Request) -> Any:
        return await call(request, "count_tokens")

    async def responses(request: Request) -> Any:
        return await call(request, "responses")

    async def stored_response(request: Request) -> Any:
        if not endpoint.authorized(request.headers):
            return unauthorized()
        found = responses_api.retrieve(endpoint, request.path_params["response_id"])
        if found is None:
            return error(EndpointRefused(404, "not_found", "no stored response with this id"))
        return JSONResponse(found)

    async def models(request: Request) -> Any:
        if not endpoint.authorized(request.headers):
            return unauthorized()
        return JSONResponse(endpoint.models())

    async def control(request: Request) -> Any:
        if not endpoint.authorized(request.headers):
            return unauthorized()
        return JSONResponse({"stop": await endpoint.wait_stop()})

    async def root(request: Request) -> Any:
        """A client's reachability probe of the base URL (HEAD/GET /): says nothing of the job."""
        return JSONResponse({"ok": True})

    async def not_found(request: Request) -> Any:
        dialect = "anthropic" if request.url.path.startswith("/v1/messages") else "openai"
        if not endpoint.authorized(request.headers):
            return unauthorized(dialect)
        return error(EndpointRefused(404, "not_found", f"no route {request.method} {request.url.path}"), dialect)

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/messages", messages, methods=["POST"]),
              Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
              Route("/v1/responses", responses, methods=["POST"]),
              Route("/v1/responses/{response_id}", stored_response, methods=["GET"]),
              Route("/", root, methods=["GET", "HEAD"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/_prorl/control", control, methods=["GET"]),
              Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
    return Starlette(routes=routes)


class EndpointServer:
    """Serve ``endpoint`` on a Unix socket for the duration of an ``async with`` block.

    On exit the endpoint is closed first (the call in flight is aborted, later ones refused),
    then the server stops and the socket is removed."""

    def __init__(self, endpoint: AgentEndpoint, socket_path: str | os.PathLike) -> None:
        self.endpoint, self.socket_path = endpoint, Path(socket_path)
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> EndpointServer:
        import uvicorn
        config = uvicorn.Config(create_app(self.endpoint), uds=str(self.socket_path), log_config=None,
                                log_level="warning", access_log=False, lifespan="off", ws="none",
                                timeout_graceful_shutdown=2, timeout_keep_alive=600)
        self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(self._server.serve())
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the endpoint server stopped while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint server did not start on {self.socket_path}")
            await asyncio.sleep(0.005)
        os.chmod(self.socket_path, 0o666)  # the sandbox's uid connects; the key guards it
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, reason: str = "the job's RUN stage ended") -> None:
        self.endpoint.close(reason)
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except TimeoutError:
                self._server.force_exit = True
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(self._task, 3)
            except BaseException:  # noqa: BLE001 - the job must still end
                log.exception("the endpoint server failed")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


@dataclass(frozen=True)
class ServedEndpoint:
    """A job's endpoint as its handler sees it (``handlers.JobEndpoint``)."""

    key: str
    socket: str
    model: str
    endpoint: AgentEndpoint

    def summary(self) -> dict[str, Any]:
        return self.endpoint.summary()


@contextlib.asynccontextmanager
async def job_endpoint(session: TokenSession | None, request: EndpointRequest | None, socket_dir: str | None,
                       time_left: Callable[[], float | None]) -> AsyncIterator[ServedEndpoint | None]:
    """Serve the endpoint a handler asked for (``endpoint_request``) on ``socket_dir``/llm.sock,
    the sandbox's socket directory, with a fresh random key, for the ``async with`` block (RUN);
    yields None when it asked for none."""
    if request is None:
        yield None
        return
    if session is None or socket_dir is None:
        raise RuntimeError("a per-job endpoint needs the job's LLM session and its sandbox")
    key = secrets.token_urlsafe(32)
    endpoint = AgentEndpoint(session, key=key, model=request.model, max_calls=request.max_calls,
                             time_left=time_left, auxiliary_models=request.auxiliary_models)
    async with EndpointServer(endpoint, Path(socket_dir) / ENDPOINT_SOCKET):
        yield ServedEndpoint(key, ENDPOINT_INSIDE, request.model, endpoint)
