"""Token-in/token-out clients for the LLM servers we support.

Each adapter sends prompt token ids and returns the generated ids and per-token logprobs
exactly as the server produced them:

=========  ==========================  ===================================================
protocol   endpoint                    notes
=========  ==========================  ===================================================
vllm       POST <base>/v1/completions  ``prompt`` as ids, ``return_token_ids``,
                                       ``logprobs: 0``, ``max_tokens`` always sent
sglang     POST <base>/generate        ``input_ids``, ``return_logprob``
llamacpp   POST <base>/completion      ``prompt`` as ids, ``n_probs``, ``return_tokens``
=========  ==========================  ===================================================

Cancelling the awaiting task closes the HTTP connection, which is how the server learns that
the request is aborted.

The HTTP client is aiohttp's, one session per event loop: a RUN worker's thousand stages share
one loop, and httpx's connection pool costs time linear in its connections for every request
(2.5-3 ms of CPU per request at a thousand in flight, against aiohttp's 0.45 ms; bench/results/burst.md).
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.helpers import ceil_timeout

from prorl_celery.core.errors import BackendError
from prorl_celery.llm.sampling import SAMPLER_KEYS


def _sampler(params: dict[str, Any], protocol: str, renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """Only the protocol's allow-listed sampler keys, under the server's own names: whatever a
    caller passes, nothing else reaches an LLM server."""
    renamed = renamed or {}
    return {renamed.get(k, k): v for k, v in params.items() if k in SAMPLER_KEYS[protocol]}


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


class LLMBackend(Protocol):
    address: str
    protocol: str  # a key of prorl_celery.llm.sampling.SAMPLER_KEYS

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Completion: ...

    async def context_length(self) -> int | None:
        """The server's context length (prompt + generation), or None when it does not say."""


def base_url(address: str) -> str:
    """``http://host:port/v1`` and ``http://host:port`` name the same server."""
    address = address.rstrip("/")
    return address[: -len("/v1")] if address.endswith("/v1") else address


#: address -> the server's model card from GET /v1/models (vLLM and SGLang both serve one)
_model_cards: dict[str, dict[str, Any]] = {}
#: address -> context length the server reported (None: it does not say)
_context_lengths: dict[str, int | None] = {}


class _HTTPBackend:
    path = ""

    def __init__(self, address: str, client: aiohttp.ClientSession) -> None:
        self.address = address
        self.url = base_url(address) + self.path
        self.client = client

    async def _get(self, url: str) -> Any:
        async with self.client.get(url) as response:
            return json.loads(await response.read())

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self.client.post(self.url, json=body) as response:
                status, data = response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            raise BackendError(f"LLM server {self.address} unreachable: {type(error).__name__}: {error}") from error
        if status != 200:
            text = data.decode("utf-8", "replace")
            raise BackendError(f"LLM server {self.address} answered {status}: {text[:500]}", status_code=status)
        return json.loads(data)

    def forget_model_card(self) -> None:
        """The server at this address was restarted, maybe on other weights or another length."""
        _model_cards.pop(self.address, None)
        _context_lengths.pop(self.address, None)

    async def _model_card(self) -> dict[str, Any]:
        card = _model_cards.get(self.address)
        if card is None:
            try:
                reply = await self._get(base_url(self.address) + "/v1/models")
                card = _model_cards[self.address] = dict(reply["data"][0])
            except (TimeoutError, aiohttp.ClientError, KeyError, IndexError, ValueError, TypeError) as error:
                raise BackendError(f"cannot read the served model of {self.address}: {error}") from error
        return card

    async def context_length(self) -> int | None:
        """From the model card's ``max_model_len`` (vLLM, SGLang), read once per server."""
        if self.address not in _context_lengths:
            try:
                value = (await self._model_card()).get("max_model_len")
            except BackendError:
                value = None
            _context_lengths[self.address] = int(value) if isinstance(value, int) and value > 0 else None
        return _context_lengths[self.address]


class VLLMBackend(_HTTPBackend):
    path = "/v1/completions"
    protocol = "vllm"

    async def _model_name(self) -> str:
        """vLLM rejects a request whose ``model`` is not the served one."""
        return (await self._model_card())["id"]

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Completion:
        body = {**_sampler(params, self.protocol), "model": await self._model_name(), "prompt": prompt_ids,
                "logprobs": 0, "return_token_ids": True, "n": 1, "stream": False}
        try:
            reply = await self._post(body)
        except BackendError as error:
            if error.status_code != 404:
                raise
            # the model name this worker cached is gone: the server was restarted on another model
            self.forget_model_card()
            reply = await self._post({**body, "model": await self._model_name()})
        choice = reply["choices"][0]
        token_ids = choice.get("token_ids")
        if token_ids is None:
            raise BackendError(f"{self.address} returned no token_ids: vLLM >= 0.10.2 is required")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return Completion(list(token_ids), [float(x or 0.0) for x in logprobs], _finish(choice.get("finish_reason")))


class SGLangBackend(_HTTPBackend):
    path = "/generate"
    protocol = "sglang"
    #: SGLang's names (it rejects "seed")
    names = {"max_tokens": "max_new_tokens", "seed": "sampling_seed", "min_tokens": "min_new_tokens"}

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Completion:
        sampling = _sampler(params, self.protocol, self.names)
        body = {"input_ids": prompt_ids, "sampling_params": sampling, "return_logprob": True}
        reply = await self._post(body)
        meta = reply.get("meta_info", {})
        pairs = meta.get("output_token_logprobs") or []
        token_ids = reply.get("output_ids") or [int(p[1]) for p in pairs]
        logprobs = [float(p[0] or 0.0) for p in pairs]
        finish = (meta.get("finish_reason") or {}).get("type")
        return Completion(list(token_ids), logprobs, _finish(finish))


class LlamaCppBackend(_HTTPBackend):
    path = "/completion"
    protocol = "llamacpp"
    names = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty"}

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Completion:
        body: dict[str, Any] = {**_sampler(params, self.protocol, self.names), "prompt": prompt_ids,
                                "n_probs": 1, "return_tokens": True, "cache_prompt": True, "stream": False}
        reply = await self._post(body)
        probs = reply.get("completion_probabilities") or []
        token_ids = reply.get("tokens") or [int(p["id"]) for p in probs]
        finish = "length" if reply.get("stop_type") == "limit" else "stop"
        return Completion(list(token_ids), self._per_token_logprobs(token_ids, probs), finish)

    def _per_token_logprobs(self, token_ids: list[int], probs: list[dict[str, Any]]) -> list[float]:
        """One logprob per generated id, or BackendError.

        llama-server reports a run of tokens that ends inside a UTF-8 character (byte-fallback
        tokens) as one entry with the last token's logprob, so the others have none; guessing
        would misalign every logprob after that point."""
        if len(probs) == len(token_ids) and all(int(p.get("id", -1)) == t for p, t in zip(probs, token_ids)):
            return [float(p.get("logprob", 0.0)) for p in probs]
        raise BackendError(
            f"llama-server {self.address} reported {len(probs)} logprob entries for {len(token_ids)} "
            f"generated tokens (it merges tokens that end inside a UTF-8 character into one entry), so "
            f"this turn has no per-token logprobs")

    async def context_length(self) -> int | None:
        """llama.cpp's ``GET /props``: ``default_generation_settings.n_ctx``."""
        if self.address not in _context_lengths:
            value = None
            try:
                props = await self._get(base_url(self.address) + "/props")
                value = props.get("default_generation_settings", {}).get("n_ctx") or props.get("n_ctx")
            except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
                pass
            _context_lengths[self.address] = int(value) if isinstance(value, int) and value > 0 else None
        return _context_lengths[self.address]


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


_ADAPTERS: dict[str, Callable[..., LLMBackend]] = {"vllm": VLLMBackend, "sglang": SGLangBackend,
                                                 "llamacpp": LlamaCppBackend}
_local = threading.local()


class DirectConnector(aiohttp.TCPConnector):
    """aiohttp's connector, connecting to a server of one address straight through the loop.

    aiohttp connects through ``aiohappyeyeballs`` (its own socket, ``sock_connect``, then
    ``create_connection(sock=...)``), which races the addresses of a name that resolves to
    several. An LLM server is mostly one address (a literal IP, or a name with one): then the
    loop's own ``create_connection`` does the same connect in one step, at half the CPU
    (47 against 95 us a connect on uvloop, and a connection per request: ``http_client``).
    Several addresses, a local address, a socket factory or TLS take aiohttp's own path."""

    async def _wrap_create_connection(self, *args: Any, **kwargs: Any) -> Any:
        addr_infos: list[Any] = kwargs.get("addr_infos") or []
        direct = (len(addr_infos) == 1 and not kwargs.get("ssl") and not getattr(self, "_local_addr_infos", None)
                  and getattr(self, "_socket_factory", None) is None)
        # an IPv6 address with flow info or a scope id: only the socket address carries them
        if not direct or any(addr_infos[0][4][2:]):
            return await super()._wrap_create_connection(*args, **kwargs)
        family, _, proto, _, address = addr_infos[0]
        timeout: aiohttp.ClientTimeout = kwargs["timeout"]
        client_error = kwargs.get("client_error", aiohttp.ClientConnectorError)
        try:
            async with ceil_timeout(timeout.sock_connect, ceil_threshold=timeout.ceil_threshold):
                return await self._loop.create_connection(args[0], str(address[0]), int(address[1]),
                                                          family=family, proto=proto)
        except OSError as error:
            if error.errno is None and isinstance(error, asyncio.TimeoutError):
                raise  # the connect timed out: aiohttp tells that apart from a refused connect
            raise client_error(kwargs["req"].connection_key, error) from error


def http_client(timeout_s: float) -> aiohttp.ClientSession:
    """One HTTP session per event loop (sessions are loop-bound), shared by every stage of the
    RUN worker's loop.

    No cap on connections: a request is one stage's turn, and the stage loop's slots already
    bound how many run at once (a cap would queue turns inside the client, unseen by the slots).
    ``timeout_s`` bounds connecting and each wait for data, as httpx's timeout did."""
    loop = asyncio.get_running_loop()
    cached = getattr(_local, "client", None)
    if cached is None or cached[0] is not loop or cached[1].closed:
        # a connection per request, none kept alive: aiohttp learns that the server closed an
        # idle one only when its loop gets to the FIN, which on a loop busy with a thousand
        # stages came after the connection was reused (the request failed: "Can not write
        # request body"); a turn takes seconds, a loopback or LAN connect a fraction of a ms
        connector = DirectConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        _local.client = (loop, aiohttp.ClientSession(connector=connector, timeout=timeout))
    return _local.client[1]


async def close_http_client() -> None:
    """Close this loop's HTTP session (a worker shutting down: no "unclosed session" warnings)."""
    cached = getattr(_local, "client", None)
    if cached is not None and cached[0] is asyncio.get_running_loop():
        _local.client = None
        await cached[1].close()


def make_backend(address: str, protocol: str, *, timeout_s: float) -> LLMBackend:
    try:
        adapter = _ADAPTERS[protocol]
    except KeyError:
        raise BackendError(f"unknown backend protocol {protocol!r}; one of {sorted(_ADAPTERS)}") from None
    return adapter(address, http_client(timeout_s))
