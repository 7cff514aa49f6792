"""The RUN worker's HTTP client for LLM servers (``prorl_celery.llm.backends.http_client``),
against a real scripted LLM server: how it connects, and that a turn's reply comes back whole
whichever way it connected."""
from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohappyeyeballs
import aiohttp
import pytest

from prorl_celery.core.errors import BackendError
from prorl_celery.llm import backends
from prorl_celery.llm.tokenizer import load_tokenizer

REPLY = "The answer is \\boxed{2}."
RULES = [{"match": "HTTPCLIENT", "scope": "prompt", "replies": [REPLY]}]


@pytest.fixture
def server(scripted_llm_server):
    return scripted_llm_server(RULES)


@pytest.fixture
def connects(monkeypatch) -> list[Any]:
    """The connects that went through aiohappyeyeballs (aiohttp's own path), by address list."""
    seen: list[Any] = []
    original = aiohappyeyeballs.start_connection

    async def counted(addr_infos: Any, **kwargs: Any) -> socket.socket:
        seen.append([info[4] for info in addr_infos])
        return await original(addr_infos, **kwargs)

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", counted)
    return seen


def _prompt(qwen3_tokenizer_dir: Any, index: int) -> list[int]:
    chat = load_tokenizer(str(qwen3_tokenizer_dir))
    return chat.prompt_ids([{"role": "user", "content": f"HTTPCLIENT {index}: what is 1 + 1?"}])


def test_turns_to_a_literal_ip_connect_through_the_loop_each_on_its_own_connection(
        server, connects, qwen3_tokenizer_dir):
    chat = load_tokenizer(str(qwen3_tokenizer_dir))

    async def go() -> list[backends.Completion]:
        try:
            backend = backends.make_backend(server.url + "/v1", "vllm", timeout_s=30)
            assert isinstance(backend.client.connector, backends.DirectConnector)
            return await asyncio.gather(*(backend.complete(_prompt(qwen3_tokenizer_dir, i), {"max_tokens": 32})
                                          for i in range(20)))
        finally:
            await backends.close_http_client()

    completions = asyncio.run(go())
    assert connects == []  # not one connect took aiohttp's happy-eyeballs path
    for completion in completions:
        assert chat.decode(completion.token_ids) == REPLY
        assert len(completion.logprobs) == len(completion.token_ids) > 0


def test_a_connector_bound_to_a_local_address_takes_aiohttps_own_path_and_gets_the_same_reply(
        server, connects, qwen3_tokenizer_dir):
    prompt = _prompt(qwen3_tokenizer_dir, 0)

    async def go() -> tuple[backends.Completion, backends.Completion]:
        async with aiohttp.ClientSession(connector=backends.DirectConnector(force_close=True)) as direct, \
                aiohttp.ClientSession(connector=backends.DirectConnector(
                    force_close=True, local_addr=("127.0.0.1", 0))) as bound:
            address = server.url + "/v1"
            return (await backends.VLLMBackend(address, direct).complete(prompt, {"max_tokens": 32, "seed": 1}),
                    await backends.VLLMBackend(address, bound).complete(prompt, {"max_tokens": 32, "seed": 1}))

    straight, eyeballed = asyncio.run(go())
    # the bound session's one request (the direct one read the model card, which is cached)
    assert len(connects) == 1
    assert straight == eyeballed


def test_a_refused_connect_is_a_backend_error_naming_the_server():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def go() -> None:
        try:
            backend = backends.make_backend(f"http://127.0.0.1:{port}", "sglang", timeout_s=5)
            await backend.complete([1, 2, 3], {"max_tokens": 4})
        finally:
            await backends.close_http_client()

    with pytest.raises(BackendError, match=f"127.0.0.1:{port} unreachable: ClientConnectorError"):
        asyncio.run(go())
