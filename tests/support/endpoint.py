"""One job's per-job endpoint in this process: a real Unix-socket HTTP server on a TokenSession
whose backend is the scripted vLLM-protocol server (tests/integration/test_openai_endpoint.py,
test_harness_apis.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import aiohttp
import httpx

from prorl_celery.endpoint.app import AgentEndpoint, EndpointServer
from prorl_celery.llm.backends import VLLMBackend
from prorl_celery.llm.session import TokenSession
from prorl_celery.llm.tokenizer import load_tokenizer

KEY = "job-key-0123456789"
#: the one tool the endpoint tests offer
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def log_of(server) -> list[dict]:
    return httpx.get(server.url + "/_log").json()


def whole(segment: dict) -> list[int]:
    return segment["prompt_ids"] + segment["response_ids"]


class Harness:
    """One job's endpoint on a UDS, an async client for it, and its session."""

    def __init__(self, server, tokenizer: str, **endpoint_options) -> None:
        self.server, self.tokenizer = server, tokenizer
        self.options = endpoint_options
        self.dir = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
        self.socket = self.dir / "llm.sock"

    async def __aenter__(self) -> Harness:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self.session = TokenSession(tokenizer=load_tokenizer(self.tokenizer),
                                    backend=VLLMBackend(self.server.url + "/v1", self.http),
                                    sampling_params={"max_tokens": 256}, max_model_len=32768, default_max_tokens=256)
        self.endpoint = AgentEndpoint(self.session, key=KEY, **self.options)
        self.served = EndpointServer(self.endpoint, self.socket)
        await self.served.__aenter__()
        self.client = self.client_with(KEY)
        return self

    def client_with(self, key: str | None) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
                                 base_url="http://endpoint", headers=headers, timeout=60)

    async def __aexit__(self, *exc) -> None:
        await self.client.aclose()
        await self.served.close()
        await self.http.close()

    async def chat(self, messages, tools=None, **extra) -> dict:
        body = {"model": "policy", "messages": messages, **({"tools": tools} if tools else {}), **extra}
        response = await self.client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()


def check_exact(trajectory: dict, log: list[dict]) -> None:
    """Every segment's ids are the backend's last request of that segment plus its output, and
    every model id and logprob is the backend's own, in order."""
    segments = trajectory.get("segments") or [trajectory]
    by_segment: dict[int, list[dict]] = {}
    assert len(trajectory["turns"]) == len(log)
    for turn, entry in zip(trajectory["turns"], log):
        by_segment.setdefault(turn.get("segment", 0), []).append(entry)
    assert sorted(by_segment) == list(range(len(segments)))
    for index, segment in enumerate(segments):
        entries = by_segment[index]
        assert whole(segment) == entries[-1]["prompt_ids"] + entries[-1]["output_ids"]
        assert segment["prompt_ids"] == entries[0]["prompt_ids"]
        model = [t for t, m in zip(segment["response_ids"], segment["response_mask"]) if m]
        assert model == [t for e in entries for t in e["output_ids"]]
        logprobs = [x for x, m in zip(segment["response_logprobs"], segment["response_mask"]) if m]
        assert logprobs == [x for e in entries for x in e["logprobs"]]


def check_samples(trajectory: dict, log: list[dict]) -> None:
    """Every sample is exactly the last backend request of its turns plus its output; its model
    tokens and logprobs are the backend's."""
    assert len(trajectory["turns"]) == len(log)
    by_sample: dict[int, list[dict]] = {}
    for turn, entry in zip(trajectory["turns"], log):
        by_sample.setdefault(turn["sample"], []).append(entry)
    assert sorted(by_sample) == [s["sample"] for s in trajectory["samples"]]
    for sample in trajectory["samples"]:
        entries = by_sample[sample["sample"]]
        assert whole(sample) == entries[-1]["prompt_ids"] + entries[-1]["output_ids"]
        assert sample["prompt_ids"] == entries[0]["prompt_ids"]
        model = [t for t, m in zip(sample["response_ids"], sample["response_mask"]) if m]
        assert model == [t for e in entries for t in e["output_ids"]]
        assert [x for x, m in zip(sample["response_logprobs"], sample["response_mask"]) if m] == \
            [x for e in entries for x in e["logprobs"]]
        assert sample["num_turns"] == len(entries)
