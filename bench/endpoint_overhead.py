"""The per-job endpoint's own cost per call at Claude Code's prompt sizes, beside a direct
backend call in the same run.

    python -m bench.endpoint_overhead                    # ~20k-token prompts, 12 calls per API
    python -m bench.endpoint_overhead --calls 12 --tokens 30000 --token-delay 0.02

A scripted LLM server (its own process; Qwen3 tokenizer) answers every call with one tool call.
Two endpoints (``AgentEndpoint`` on a Unix socket, each over its own ``TokenSession``, as the RUN
worker serves them) hold one conversation each, shaped like Claude Code's: a long system prompt
(two text blocks), 16 tools with JSON schemas, a long first user message, then a tool result of
about 500 tokens per turn. The first call starts at ``--tokens`` prompt tokens; every agent call
re-sends the whole history, as Claude Code and Codex do:

- **messages**: ``POST /v1/messages`` (Anthropic's shape; history as content blocks);
- **responses**: ``POST /v1/responses`` (Codex's shape: ``instructions``, input items, ``store: false``);
- **direct**: right after each of them, ``VLLMBackend.complete`` of the very ids that call sent to
  the backend, from the same process (no endpoint, no session).

Per call: the client's wall time of the HTTP request (the JSON encoding and httpx of the client
run in this process too, so this is an upper bound of what a sandboxed agent waits), the backend
time inside it, and the direct call's time. ``added`` = the endpoint call minus its backend call;
the ratio is the endpoint call over the direct call. ``added CPU`` is this process's CPU time
during the endpoint call minus during the direct call: the endpoint's own work plus the agent
client's (JSON encoding, httpx), which contention on a shared machine inflates far less than
wall time. Target: added <= 5 % of the direct call at
20k tokens with ``--token-delay 0.02`` (a 50 token/s decode, slow for a GPU server but nothing
like a cold 20k prefill); at ``--token-delay 0`` the direct call is the scripted server's own
overhead, the worst case, and the ratio is printed too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import machine_note, markdown_table, run_benchmark

RESULTS = Path(__file__).parent / "results" / "endpoint_overhead.json"
KEY = "bench-key"
REPLY = "Let me look at the next file.\n<tool_call>\n" + json.dumps(
    {"name": "Bash", "arguments": {"command": "cat src/module.py"}}) + "\n</tool_call>"
WORDS = ("def class return import self value result error config request response handler parse token "
         "session buffer stream index offset length module package function argument").split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.endpoint_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=12, help="measured calls per API")
    parser.add_argument("--tokens", type=int, default=20000, help="prompt tokens of the first measured call")
    parser.add_argument("--token-delay", type=float, default=0.02,
                        help="seconds per generated token at the scripted server (0: its bare overhead)")
    args = parser.parse_args(argv)
    from prorl_celery.core.event_loops import new_event_loop

    def in_loop() -> dict[str, Any]:  # the RUN worker's own kind of loop (uvloop's)
        loop = new_event_loop()
        try:
            return loop.run_until_complete(run(args))
        finally:
            loop.close()
    return run_benchmark(in_loop, report, RESULTS,
                         lambda result: all(p["added_pct_median"] <= 5.0 for p in result["apis"].values()))


def text(rng: random.Random, words: int) -> str:
    lines, line = [], []
    for _ in range(words):
        line.append(rng.choice(WORDS))
        if len(line) == 12:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines + [" ".join(line)])


def claude_code_like(rng: random.Random, first_user_words: int) -> dict[str, Any]:
    """A system prompt, tools and a first user message of about Claude Code's sizes."""
    tools = [{"name": f"Tool{n}", "description": text(rng, 120),
              "input_schema": {"type": "object", "properties": {
                  f"arg{k}": {"type": "string", "description": text(rng, 25)} for k in range(4)},
                  "required": ["arg0"]}} for n in range(15)]
    tools.append({"name": "Bash", "description": "Run a shell command. " + text(rng, 200), "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}})
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
              {"type": "text", "text": text(rng, 2500), "cache_control": {"type": "ephemeral"}}]
    return {"system": system, "tools": tools, "user": "BENCH " + text(rng, first_user_words)}


class TimedBackend:
    """The real backend, timing each ``complete`` (the endpoint's call to it)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.seconds, self.last_prompt = backend, 0.0, []
        self.protocol, self.address = backend.protocol, backend.address

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return await self.backend.complete(prompt_ids, params)
        finally:
            self.seconds, self.last_prompt = time.perf_counter() - started, list(prompt_ids)

    async def context_length(self) -> int | None:
        return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp
    import httpx

    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import free_port
    from prorl_celery.endpoint import anthropic_messages
    from prorl_celery.endpoint.app import AgentEndpoint, EndpointServer
    from prorl_celery.llm.backends import VLLMBackend
    from prorl_celery.llm.session import TokenSession
    from prorl_celery.llm.tokenizer import load_tokenizer

    tokenizer_dir = str(ensure_tokenizer("qwen3"))
    directory = Path(tempfile.mkdtemp(prefix="prorl-endpoint-bench-"))
    rules = directory / "rules.json"
    rules.write_text(json.dumps([{"match": "BENCH", "scope": "prompt", "replies": [REPLY]}]))
    port = free_port()
    loadavg = os.getloadavg()
    server = subprocess.Popen([sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules),
                               "--tokenizer", tokenizer_dir, "--port", str(port), "--log-level", "warning",
                               "--token-delay", str(args.token_delay)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
    servers: list[EndpointServer] = []
    try:
        address = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                async with http.get(address + "/health") as probe:
                    if probe.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the scripted LLM server did not start")
            await asyncio.sleep(0.5)
        tok = load_tokenizer(tokenizer_dir)
        direct = VLLMBackend(address + "/v1", http)
        clients, backends, endpoints = {}, {}, {}
        for api in ("messages", "responses"):
            timed = TimedBackend(VLLMBackend(address + "/v1", http))
            session = TokenSession(tokenizer=tok, backend=timed, sampling_params={"max_tokens": 64},  # type: ignore[arg-type]
                                   max_model_len=200_000, default_max_tokens=64)
            endpoints[api] = AgentEndpoint(session, key=KEY, model="policy")
            served = EndpointServer(endpoints[api], directory / f"{api}.sock")
            await served.__aenter__()
            servers.append(served)
            backends[api] = timed
            clients[api] = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(served.socket_path)),
                                             base_url="http://endpoint", timeout=600,
                                             headers={"x-api-key": KEY, "authorization": f"Bearer {KEY}"})
        rng = random.Random(7)
        shape = claude_code_like(random.Random(7), 100)
        system = "\n\n".join(block["text"] for block in shape["system"])
        base = len(tok.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": shape["user"]}],
                                  anthropic_messages.to_tools(shape["tools"])))
        shape = claude_code_like(random.Random(7), 100 + max(0, args.tokens - base))  # about a token a word
        conversations = {"messages": Messages(shape), "responses": Responses(shape)}
        per_call: dict[str, list[dict[str, float]]] = {api: [] for api in conversations}
        for call in range(args.calls + 1):  # the first call of each is a warm-up (the session starts)
            observation = text(rng, 380)
            for api, conversation in conversations.items():
                body = conversation.body()
                started, cpu = time.perf_counter(), time.process_time()
                response = await clients[api].post(f"/v1/{api}", json=body)
                endpoint_s, endpoint_cpu = time.perf_counter() - started, time.process_time() - cpu
                if response.status_code != 200:
                    raise RuntimeError(f"/v1/{api}: {response.status_code} {response.text[:300]}")
                conversation.answered(response.json(), observation)
                ids = backends[api].last_prompt
                started, cpu = time.perf_counter(), time.process_time()
                await direct.complete(ids, {"max_tokens": 64})
                direct_s, direct_cpu = time.perf_counter() - started, time.process_time() - cpu
                if call:
                    converse_s = endpoints[api].call_log[-1]["seconds"]  # lock to reply, the backend call within
                    per_call[api].append({"prompt_tokens": len(ids), "endpoint_ms": endpoint_s * 1e3,
                                          "backend_ms": backends[api].seconds * 1e3, "direct_ms": direct_s * 1e3,
                                          "session_ms": (converse_s - backends[api].seconds) * 1e3,
                                          "added_cpu_ms": (endpoint_cpu - direct_cpu) * 1e3})
        drift = {api: s.endpoint.summary()["drift_events"] for api, s in zip(conversations, servers)}
        for client in clients.values():
            await client.aclose()
    finally:
        for served in servers:
            await served.close()
        await http.close()
        server.terminate()
        server.wait(10)
    apis = {}
    for api, calls in per_call.items():
        added = [c["endpoint_ms"] - c["backend_ms"] for c in calls]
        apis[api] = {"calls": calls, "drift_events": drift[api],
                     "prompt_tokens_median": statistics.median(c["prompt_tokens"] for c in calls),
                     "endpoint_ms_median": statistics.median(c["endpoint_ms"] for c in calls),
                     "direct_ms_median": statistics.median(c["direct_ms"] for c in calls),
                     "added_ms_median": statistics.median(added),
                     "session_ms_median": statistics.median(c["session_ms"] for c in calls),
                     "added_cpu_ms_median": statistics.median(c["added_cpu_ms"] for c in calls),
                     "ratio_median": statistics.median(c["endpoint_ms"] / c["direct_ms"] for c in calls),
                     "added_pct_median": statistics.median(100 * a / c["direct_ms"] for a, c in zip(added, calls))}
    return {"date": time.strftime("%Y-%m-%d"), "calls": args.calls, "tokens": args.tokens,
            "token_delay_s": args.token_delay, "apis": apis,
            "machine": {"cpus": os.cpu_count(), "loadavg_before": loadavg}}


class Messages:
    """Claude Code's side of the conversation: the whole history as content blocks each call."""

    def __init__(self, shape: dict[str, Any]) -> None:
        self.shape = shape
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": shape["user"]}]}]

    def body(self) -> dict[str, Any]:
        return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": self.shape["system"],
                "tools": self.shape["tools"], "messages": self.messages, "metadata": {"user_id": "bench"}}

    def answered(self, message: dict[str, Any], observation: str) -> None:
        self.messages.append({"role": "assistant", "content": message["content"]})
        use = next(b for b in message["content"] if b["type"] == "tool_use")
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": observation}]})


class Responses:
    """Codex's side: instructions, tools and every item so far each call (``store: false``)."""

    def __init__(self, shape: dict[str, Any]) -> None:
        self.instructions = "\n\n".join(block["text"] for block in shape["system"])
        self.tools = [{"type": "function", "name": t["name"], "description": t["description"],
                       "parameters": t["input_schema"], "strict": False} for t in shape["tools"]]
        self.items: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": shape["user"]}]}]

    def body(self) -> dict[str, Any]:
        return {"model": "gpt-5-codex", "instructions": self.instructions, "tools": self.tools, "input": self.items,
                "store": False, "tool_choice": "auto", "parallel_tool_calls": False, "max_output_tokens": 64,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "bench"}

    def answered(self, response: dict[str, Any], observation: str) -> None:
        self.items += response["output"]
        call = next(item for item in response["output"] if item["type"] == "function_call")
        self.items.append({"type": "function_call_output", "call_id": call["call_id"], "output": observation})


def report(result: dict[str, Any]) -> str:
    rows = []
    for api, part in result["apis"].items():
        rows.append([f"`/v1/{api}`", f"{part['prompt_tokens_median']:.0f}", f"{part['endpoint_ms_median']:.1f}",
                     f"{part['direct_ms_median']:.1f}", f"{part['added_ms_median']:.1f}",
                     f"{part['session_ms_median']:.1f}", f"{part['added_cpu_ms_median']:.1f}",
                     f"{part['added_pct_median']:.1f} %", f"{part['ratio_median']:.3f}",
                     str(len(part["drift_events"]))])
    lines = [f"endpoint overhead, {result['date']}: {result['calls']} calls per API, token delay "
             f"{result['token_delay_s']} s; {machine_note(result)}", ""]
    lines += markdown_table(["API", "prompt tokens", "endpoint call ms", "direct call ms", "added ms",
                             "of it session ms", "added CPU ms", "added / direct", "ratio endpoint/direct",
                             "drift events"], rows)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
