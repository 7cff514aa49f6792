"""FastAPI app speaking vLLM, SGLang and llama.cpp protocols on top of one engine.

=======  ==========================  =============================================
method   path                        what
=======  ==========================  =============================================
POST     /v1/completions             vLLM OpenAI-compatible completions
POST     /generate                   SGLang native generate
POST     /completion, /completions   llama.cpp ``llama-server`` native completion
GET      /v1/models                  the served model
GET      /get_model_info             SGLang's model info
GET      /health                     ``{"status": "ok"}``
GET      /_log                       every request served (ids, logprobs, aborted, times)
POST     /_reset                     clear ``/_log``
=======  ==========================  =============================================

A client that disconnects mid-generation aborts it: the generation runs as a task beside a
watcher of the connection, and the request is recorded with ``aborted: true``.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from prorl_celery.dev.llm_server.engines import Engine, SamplingParams
from prorl_celery.dev.llm_server.protocols import (
    BadRequestError,
    Generation,
    LlamaCppCompletionRequest,
    SGLangGenerateRequest,
    TokenText,
    VLLMCompletionRequest,
    llamacpp_response,
    sglang_response,
    vllm_response,
)

#: nginx's "client closed request": what an aborted request is answered with (no one reads it)
CLIENT_CLOSED = 499


class LLMServer:
    """The app's state: engine, token texts and the request log."""

    def __init__(self, engine: Engine, *, log_limit: int = 100_000, log_file: Path | None = None) -> None:
        self.engine = engine
        self.texts = TokenText(engine.tokenizer)
        #: bounded so a long bench cannot exhaust memory; oldest records go first
        self.log: deque[Generation] = deque(maxlen=log_limit)
        #: every generation answered, one JSON line each, written before its answer is sent:
        #: the record of a server that is SIGKILLed (``bench.chaos``)
        self.log_file = open(log_file, "a", encoding="utf-8") if log_file else None  # noqa: SIM115

    # -- request -> (prompt ids, sampling params), with the real servers' checks

    def prompt_ids(self, prompt: list[int] | str | None, *,
                   add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = (self.engine.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
                          if isinstance(prompt, str) else list(prompt or []))
        if not ids:
            raise BadRequestError("the prompt is empty")
        vocab = self.engine.vocab_size
        for token_id in ids:
            if not 0 <= token_id < vocab:
                raise BadRequestError(f"Token id {token_id} is out of vocabulary (size {vocab})")
        return ids

    def room(self, prompt_ids: list[int]) -> int:
        """Tokens left in the context after the prompt; 400 when the prompt fills it."""
        limit = self.engine.max_model_len
        if len(prompt_ids) >= limit:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {len(prompt_ids)} input tokens. Please reduce the length of the input.")
        return limit - len(prompt_ids)

    # -- running one generation

    async def run(self, request: Request, protocol: str, prompt_ids: list[int],
                  params: SamplingParams, body: BaseModel) -> Generation | None:
        """Generate, or return None when the client went away first (recorded as aborted)."""
        gen = Generation(request_id=uuid.uuid4().hex, protocol=protocol, prompt_ids=prompt_ids,
                         params=params, started=time.time(), request_keys=sent_keys(body))
        self.log.append(gen)
        work = asyncio.ensure_future(self._drive(gen))
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                gen.aborted, gen.finish_reason, gen.finished = True, "abort", time.time()
        if gen.aborted:
            return None
        work.result()  # re-raise an engine failure
        if self.log_file is not None:
            self.log_file.write(json.dumps(gen.log_record()) + "\n")
            self.log_file.flush()
        return gen

    async def _drive(self, gen: Generation) -> None:
        params, engine = gen.params, self.engine
        eos = None if params.ignore_eos else engine.eos_token_id
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= engine.extra_eos_ids
        gen.finish_reason = "length"
        if params.max_tokens > 0:
            steps = engine.generate(gen.prompt_ids, params)
            try:
                async for step in steps:
                    gen.output_ids.append(step.token_id)
                    gen.logprobs.append(step.logprob)
                    gen.tops.append(step.top)
                    if step.token_id == eos or step.token_id in stops:
                        gen.finish_reason, gen.stop_token = "stop", step.token_id
                        gen.stopped_on_eos = step.token_id == eos
                        break
                    if len(gen.output_ids) >= params.max_tokens:
                        break
                else:  # the engine had nothing more to say
                    gen.finish_reason = "stop"
            finally:
                await steps.aclose()
        gen.finished = time.time()


async def _wait_for_disconnect(request: Request) -> None:
    # the body is already read, so the next ASGI message can only be the disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass


#: (protocol path, field another protocol uses) -> what this protocol calls it
_MISNAMED = {("/v1/completions", "max_new_tokens"): "max_tokens",
             ("/v1/completions", "n_predict"): "max_tokens",
             ("/generate", "seed"): "sampling_seed",
             ("/generate", "max_tokens"): "max_new_tokens",
             ("/completion", "max_tokens"): "n_predict",
             ("/completion", "logprobs"): "n_probs",
             ("/completion", "stop_token_ids"): None}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}},
                        status_code=status)


def _describe(path: str, error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error["loc"][1:]) or "body"
    message = f"{where}: {error['msg']}"
    key = ("/completion" if path == "/completions" else path, str(error["loc"][-1]))
    if error["type"] == "extra_forbidden" and key in _MISNAMED:
        better = _MISNAMED[key]
        message += f" (this server's name for it is {better!r})" if better else \
            " (not in this protocol)"
    return message


def sent_keys(body: BaseModel, prefix: str = "") -> list[str]:
    """Every field the client sent, nested ones as ``parent.child`` (the ``/_log`` record)."""
    keys = []
    for name in sorted(body.model_fields_set):
        value = getattr(body, name)
        keys += sent_keys(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else [prefix + name]
    return keys


def _sampling(*, max_tokens: int, temperature: float | None, top_p: float | None,
              top_k: int | None, min_p: float | None, seed: int | None,
              stop_token_ids: list[int] | None, ignore_eos: bool,
              top_logprobs: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p, top_k=0 if top_k is None or top_k < 0 else top_k,
        min_p=min_p or 0.0, seed=seed, stop_token_ids=frozenset(stop_token_ids or ()),
        ignore_eos=ignore_eos, top_logprobs=top_logprobs)


def create_llm_app(engine: Engine, *, log_limit: int = 100_000, log_file: Path | None = None) -> FastAPI:
    """The HTTP server for ``engine`` (see the module docstring for its routes)."""
    app = FastAPI(title="prorl-celery LLM server", docs_url=None, redoc_url=None)
    server = app.state.llm = LLMServer(engine, log_limit=log_limit, log_file=log_file)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        # 400 rather than FastAPI's 422, as vLLM answers
        return _error(400, "; ".join(_describe(request.url.path, e) for e in error.errors()))

    @app.exception_handler(BadRequestError)
    async def _bad(_: Request, error: BadRequestError) -> JSONResponse:
        return _error(400, str(error))

    @app.post("/v1/completions", response_model=None)
    async def vllm_completions(body: VLLMCompletionRequest, request: Request) -> Any:
        prompt = server.prompt_ids(body.prompt, add_special_tokens=body.add_special_tokens)
        room = server.room(prompt)
        if body.max_tokens is not None and body.max_tokens > room:
            raise BadRequestError(
                f"'max_tokens' is too large: {body.max_tokens}. This model's maximum context "
                f"length is {engine.max_model_len} tokens and your request has {len(prompt)} "
                f"input tokens ({body.max_tokens} > {engine.max_model_len} - {len(prompt)}).")
        params = _sampling(
            max_tokens=room if body.max_tokens is None else body.max_tokens,
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
            seed=body.seed, stop_token_ids=body.stop_token_ids, ignore_eos=body.ignore_eos,
            top_logprobs=body.logprobs or 0)
        gen = await server.run(request, "vllm", prompt, params, body)
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        return vllm_response(gen, body, server.texts, engine.model_name)

    @app.post("/generate", response_model=None)
    async def sglang_generate(body: SGLangGenerateRequest, request: Request) -> Any:
        if (body.input_ids is None) == (body.text is None):
            raise BadRequestError("give exactly one of input_ids and text")
        prompt = server.prompt_ids(body.input_ids if body.text is None else body.text)
        room, sp = server.room(prompt), body.sampling_params
        params = _sampling(
            max_tokens=room if sp.max_new_tokens is None else min(sp.max_new_tokens, room),
            temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
            seed=sp.sampling_seed, stop_token_ids=sp.stop_token_ids, ignore_eos=sp.ignore_eos,
            top_logprobs=body.top_logprobs_num if body.return_logprob else 0)
        gen = await server.run(request, "sglang", prompt, params, body)
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        return sglang_response(gen, body, server.texts)

    async def llamacpp_completion(body: LlamaCppCompletionRequest, request: Request) -> Any:
        prompt = server.prompt_ids(body.prompt)
        room = server.room(prompt)
        params = _sampling(
            max_tokens=room if body.n_predict < 0 else min(body.n_predict, room),
            # llama.cpp samples greedily at temperature <= 0
            temperature=max(body.temperature, 0.0), top_p=body.top_p, top_k=body.top_k,
            min_p=body.min_p, seed=None if body.seed < 0 else body.seed, stop_token_ids=None,
            ignore_eos=body.ignore_eos, top_logprobs=body.n_probs)
        gen = await server.run(request, "llamacpp", prompt, params, body)
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        return llamacpp_response(gen, body, server.texts, engine.model_name)

    for path in ("/completion", "/completions"):
        app.post(path, response_model=None)(llamacpp_completion)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": engine.model_name, "object": "model", "created": int(time.time()),
                "owned_by": "prorl-celery", "root": engine.model_name, "parent": None,
                "max_model_len": engine.max_model_len, "permission": []}
        return {"object": "list", "data": [card]}

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": engine.model_name, "tokenizer_path": engine.model_name,
                "is_generation": True}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/_log")
    async def request_log() -> list[dict[str, Any]]:
        return [gen.log_record() for gen in server.log]

    @app.post("/_reset")
    async def reset() -> dict[str, int]:
        cleared = len(server.log)
        server.log.clear()
        return {"cleared": cleared}

    return app
