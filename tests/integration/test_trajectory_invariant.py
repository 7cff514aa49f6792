"""The trajectory invariant: one logprob per generated id, for every protocol, or the turn fails.

llama-server reports a run of byte-fallback tokens (a character split over several tokens) as
one ``completion_probabilities`` entry; the reference server does the same, so these tests meet
the behaviour a real llama-server shows.
"""
from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from aiohttp import web

from prorl_celery.core.errors import BackendError
from prorl_celery.llm.backends import Completion, LlamaCppBackend, SGLangBackend, VLLMBackend
from prorl_celery.llm.session import TokenSession
from prorl_celery.llm.tokenizer import load_tokenizer

pytest_plugins = ["tests.conftest_llm"]

EMOJI_REPLY = "Done 😊🦀"  # Qwen3: 'Done', ' \xf0\x9f\x98' (ends inside 😊), '\x8a', '🦀'
ASCII_REPLY = "Done, all good."


@pytest.fixture
def emoji_server(scripted_llm_server):
    return scripted_llm_server([{"match": "EMOJI", "replies": [EMOJI_REPLY]},
                                {"match": "ASCII", "replies": [ASCII_REPLY]}], "qwen3")


def prompt(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=False)
    return tok.encode(rendered, add_special_tokens=False)


def complete(backend_class, server, ids: list[int]) -> Completion:
    async def go() -> Completion:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
            address = server.url + ("/v1" if backend_class is VLLMBackend else "")
            return await backend_class(address, client).complete(ids, {"max_tokens": 32, "temperature": 0})
    return asyncio.run(go())


def test_llamacpp_merges_byte_fallback_tokens_like_the_real_server(emoji_server, qwen3_hf_tokenizer):
    tok = qwen3_hf_tokenizer
    body = httpx.post(emoji_server.url + "/completion", json={
        "prompt": prompt(tok, "EMOJI"), "n_predict": 32, "n_probs": 1, "return_tokens": True}).json()
    assert len(body["tokens"]) == 5  # four text tokens and the end-of-turn token
    entries = body["completion_probabilities"]
    assert len(entries) == 4
    assert bytes(entries[1]["bytes"]) == " 😊".encode() and entries[1]["id"] == body["tokens"][2]


def test_llamacpp_adapter_refuses_merged_logprobs(emoji_server, qwen3_hf_tokenizer):
    with pytest.raises(BackendError, match="4 logprob entries for 5 generated tokens"):
        complete(LlamaCppBackend, emoji_server, prompt(qwen3_hf_tokenizer, "EMOJI"))
    fine = complete(LlamaCppBackend, emoji_server, prompt(qwen3_hf_tokenizer, "ASCII"))
    assert len(fine.token_ids) == len(fine.logprobs) > 1


@pytest.mark.parametrize("backend_class", [VLLMBackend, SGLangBackend])
def test_other_protocols_keep_one_logprob_per_byte_fallback_token(backend_class, emoji_server,
                                                                  qwen3_hf_tokenizer):
    completion = complete(backend_class, emoji_server, prompt(qwen3_hf_tokenizer, "EMOJI"))
    assert len(completion.token_ids) == len(completion.logprobs) == 5
    assert all(lp <= 0 for lp in completion.logprobs)


class _ShortLogprobs:
    """A backend whose answer breaks the invariant (as a buggy adapter or server would)."""

    address = "http://broken"

    async def complete(self, prompt_ids, params):
        return Completion([11, 12, 13], [-0.1, -0.2], "stop")

    async def context_length(self):
        return None


def test_session_refuses_a_turn_whose_lengths_disagree(qwen3_tokenizer_dir):
    session = TokenSession(tokenizer=load_tokenizer(str(qwen3_tokenizer_dir)), backend=_ShortLogprobs(),
                           sampling_params={}, max_model_len=4096, default_max_tokens=16)
    session.start([{"role": "user", "content": "hi"}])
    with pytest.raises(BackendError, match="3 token ids but 2 logprobs"):
        asyncio.run(session.generate())
    assert session.response_ids == [] and session.response_logprobs == []


def test_vllm_adapter_rereads_the_model_after_a_restart_on_another_model():
    """A vLLM restarted at the same address on other weights serves another model name; the
    worker's cached name gets a 404 once, then the adapter reads /v1/models again."""
    from prorl_celery.llm import backends

    seen = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "policy-v2", "max_model_len": 4096}]})

    async def completions(request: web.Request) -> web.Response:
        model = (await request.json())["model"]
        seen.append(model)
        if model != "policy-v2":
            return web.json_response({"message": f"The model `{model}` does not exist."}, status=404)
        return web.json_response({"choices": [{"token_ids": [5, 6], "finish_reason": "stop",
                                               "logprobs": {"token_logprobs": [-0.5, -0.25]}}]})

    async def go() -> Completion:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        address = f"http://127.0.0.1:{port}/v1"
        backends._model_cards[address] = {"id": "policy-v1"}  # what the worker read before the restart
        try:
            async with aiohttp.ClientSession() as client:
                return await VLLMBackend(address, client).complete([1, 2], {"max_tokens": 4})
        finally:
            await runner.cleanup()
    completion = asyncio.run(go())
    assert seen == ["policy-v1", "policy-v2"] and completion.token_ids == [5, 6]
    assert completion.logprobs == [-0.5, -0.25]
