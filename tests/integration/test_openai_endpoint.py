"""The per-job OpenAI-compatible endpoint, in process: a real Unix-socket HTTP server on a
TokenSession whose backend is the scripted vLLM-protocol server (real Qwen3 token ids).

Every test checks the ids against what the backend saw (its ``/_log``)."""
from __future__ import annotations

import asyncio
import json

import pytest

from handlers.tool_calls import tool_call
from tests.support.endpoint import KEY, TOOLS, Harness, log_of, whole
from tests.support.services import eventually

RULES = [
    {"match": "E2E-TOOLS", "scope": "prompt", "replies": [
        "Listing first.\n" + tool_call("bash", command="ls"), tool_call("bash", command="cat a.txt"), "All done."]},
    {"match": "E2E-THINK", "scope": "prompt", "replies": [
        "<think>\nThe user greets me.\n</think>\n\nHello!", "<think>\nSecond question.\n</think>\n\n42"]},
    {"match": "E2E-SLOW", "replies": ["late"], "delay_s": 30},
    {"match": "E2E-TEXT", "scope": "prompt", "replies": [" first part.", " second part."]},
]


@pytest.fixture
def backend(scripted_llm_server):
    return scripted_llm_server(RULES)


@pytest.fixture
def tok(qwen3_tokenizer) -> str:
    return qwen3_tokenizer


def test_tool_calls_keep_exact_ids_across_turns(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            messages = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "E2E-TOOLS go"}]
            first = await h.chat(messages, TOOLS, logprobs=True)
            choice = first["choices"][0]
            assert choice["finish_reason"] == "tool_calls"
            assert choice["message"]["content"] == "Listing first."
            [tool_call] = choice["message"]["tool_calls"]
            assert tool_call["function"]["name"] == "bash"
            assert json.loads(tool_call["function"]["arguments"]) == {"command": "ls"}
            assert len(choice["logprobs"]["content"]) == first["usage"]["completion_tokens"]
            messages += [choice["message"], {"role": "tool", "tool_call_id": tool_call["id"], "content": "a.txt\n"}]
            second = await h.chat(messages, TOOLS)
            messages += [second["choices"][0]["message"],
                         {"role": "tool", "tool_call_id": second["choices"][0]["message"]["tool_calls"][0]["id"],
                          "content": "hello"}]
            third = await h.chat(messages, TOOLS)
            assert third["choices"][0]["message"] == {"role": "assistant", "content": "All done."}
            assert third["choices"][0]["finish_reason"] == "stop"
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    assert len(log) == 3
    assert trajectory["drift_events"] == [] and len(trajectory["segments"]) == 1
    # each call's prompt is the previous call's prompt + output + only the new messages' suffix
    for before, after in zip(log, log[1:]):
        assert after["prompt_ids"][:len(before["prompt_ids"]) + len(before["output_ids"])] == \
            before["prompt_ids"] + before["output_ids"]
    assert whole(trajectory) == log[-1]["prompt_ids"] + log[-1]["output_ids"]
    model = [i for i, m in zip(trajectory["response_ids"], trajectory["response_mask"]) if m]
    assert model == [t for entry in log for t in entry["output_ids"]]
    assert [lp for lp, m in zip(trajectory["response_logprobs"], trajectory["response_mask"]) if m] == \
        [x for entry in log for x in entry["logprobs"]]


def test_history_rewrite_starts_a_segment_with_a_drift_event(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            messages = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "E2E-TOOLS go"}]
            first = await h.chat(messages, TOOLS)
            reply = first["choices"][0]["message"]
            messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a.txt"}]
            await h.chat(messages, TOOLS)
            rewritten = [dict(m) for m in messages]
            rewritten[0]["content"] = "You run commands carefully."  # the agent edits an earlier message
            await h.chat(rewritten, TOOLS)
            return h.session.segmented_trajectory(), h.endpoint.summary()

    trajectory, summary = asyncio.run(main())
    log = log_of(backend)
    [event] = trajectory["drift_events"]
    assert event["message"] == 0 and "rewritten" in event["reason"] and event["call"] == 3
    assert event["drifted_tokens"] > 0 and summary["drifted_tokens"] == event["drifted_tokens"]
    first, second = trajectory["segments"]
    assert whole(first) == log[1]["prompt_ids"] + log[1]["output_ids"]
    assert whole(second) == log[2]["prompt_ids"] + log[2]["output_ids"]
    assert second["prompt_ids"] == log[2]["prompt_ids"]
    assert trajectory["prompt_ids"] == second["prompt_ids"]  # top level: the last segment
    for segment in trajectory["segments"]:
        assert len(segment["response_ids"]) == len(segment["response_mask"]) == len(segment["response_logprobs"])


def test_qwen3_think_is_dropped_by_the_template_so_a_new_segment_starts(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            messages = [{"role": "user", "content": "E2E-THINK hi"}]
            first = await h.chat(messages)
            message = first["choices"][0]["message"]
            assert message["content"] == "Hello!" and message["reasoning_content"] == "The user greets me."
            messages += [{"role": "assistant", "content": message["content"]}, {"role": "user", "content": "and?"}]
            await h.chat(messages)
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    [event] = trajectory["drift_events"]
    assert event["message"] == 1 and "<think>" in event["reason"]
    first, second = trajectory["segments"]
    assert whole(first) == log[0]["prompt_ids"] + log[0]["output_ids"]
    assert whole(second) == log[1]["prompt_ids"] + log[1]["output_ids"]
    assert event["kept_tokens"] < len(log[0]["prompt_ids"]) + len(log[0]["output_ids"])


def test_key_is_required_and_scoped_to_the_job(backend, tok):
    async def main():
        async with Harness(backend, tok) as a, Harness(backend, tok) as b:
            b.endpoint.key = "another-job-key-987654"
            for client in (a.client_with(None), a.client_with("wrong"), a.client_with(b.endpoint.key)):
                async with client:
                    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                                         ("GET", "/_prorl/control"), ("GET", "/anything")):
                        response = await client.request(method, path, json={"messages": []})
                        assert response.status_code == 401, (path, response.text)
            async with b.client_with(KEY) as client:  # job a's key does not open job b's endpoint
                assert (await client.get("/v1/models")).status_code == 401
            models = (await a.client.get("/v1/models")).json()
            assert models["data"][0]["id"] == "policy"
            return a.session.num_turns

    assert asyncio.run(main()) == 0
    assert log_of(backend) == []


def test_openai_sdk_streaming_and_function_tools(backend, tok):
    openai = pytest.importorskip("openai")

    async def main():
        async with Harness(backend, tok) as h:
            client = openai.AsyncOpenAI(base_url="http://endpoint/v1", api_key=KEY, http_client=h.client_with(None))
            messages = [{"role": "user", "content": "E2E-TOOLS stream"}]
            stream = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stream=True,
                                                          stream_options={"include_usage": True})
            content, calls, finish, usage = "", {}, None, None
            async for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for call_delta in choice.delta.tool_calls or []:
                        entry = calls.setdefault(call_delta.index, {"id": call_delta.id, "name": "", "arguments": ""})
                        entry["name"] += call_delta.function.name or ""
                        entry["arguments"] += call_delta.function.arguments or ""
                    finish = choice.finish_reason or finish
            assert content == "Listing first." and finish == "tool_calls" and usage.completion_tokens > 0
            assert calls[0]["name"] == "bash" and json.loads(calls[0]["arguments"]) == {"command": "ls"}
            messages += [{"role": "assistant", "content": content, "tool_calls": [
                {"id": calls[0]["id"], "type": "function",
                 "function": {"name": "bash", "arguments": calls[0]["arguments"]}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "a.txt"}]
            second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            assert second.choices[0].message.tool_calls[0].function.name == "bash"
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    assert trajectory["drift_events"] == []
    assert whole(trajectory) == log[-1]["prompt_ids"] + log[-1]["output_ids"]


def test_limits_max_calls_and_close_aborts_the_pending_call(backend, tok):
    async def main():
        async with Harness(backend, tok, max_calls=1) as h:
            messages = [{"role": "user", "content": "E2E-TOOLS go"}]
            first = await h.chat(messages, TOOLS)
            messages += [first["choices"][0]["message"], {"role": "tool", "content": "x"}]
            refused = await h.client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "max_iterations"
            stop = await h.client.get("/_prorl/control")
            assert stop.json() == {"stop": "max_iterations"}
        async with Harness(backend, tok) as h:
            served = len(log_of(backend))
            pending = asyncio.ensure_future(h.client.post("/v1/chat/completions",
                                                          json={"messages": [{"role": "user", "content": "E2E-SLOW"}]}))
            # the call is in flight at the backend (not only in the endpoint): then close
            while not h.endpoint._inflight or len(log_of(backend)) == served:
                await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            started = loop.time()
            h.endpoint.close("the job was cancelled")
            response = await pending
            assert loop.time() - started < 5
            assert response.status_code == 403 and response.json()["error"]["code"] == "job_ended"
            later = await h.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert later.status_code == 403
            socket = h.socket
        assert not socket.exists()  # the job's RUN ended: nothing listens any more

    asyncio.run(main())

    def aborted() -> bool:  # the server logs a request when it notices the closed connection
        return any(entry["finish_reason"] in ("abort", None) or entry["aborted"] for entry in log_of(backend))
    eventually(aborted, 10, "the backend request of the aborted call cancelled")


def test_completions_extend_text_exactly_and_rewrites_drift(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            prompt = "E2E-TEXT The story:"
            first = (await h.client.post("/v1/completions", json={"prompt": prompt, "logprobs": 1})).json()
            text = first["choices"][0]["text"]
            assert len(first["choices"][0]["logprobs"]["tokens"]) == first["usage"]["completion_tokens"]
            served = h.session.tokenizer.decode(h.session.context_ids, False)
            await h.client.post("/v1/completions", json={"prompt": served + " And then"})
            await h.client.post("/v1/completions", json={"prompt": "E2E-TEXT A different story:"})
            return text, h.session.segmented_trajectory()

    text, trajectory = asyncio.run(main())
    log = log_of(backend)
    assert text
    first, second = trajectory["segments"]
    assert whole(first) == log[1]["prompt_ids"] + log[1]["output_ids"]
    assert log[1]["prompt_ids"][:len(log[0]["prompt_ids"]) + len(log[0]["output_ids"])] == \
        log[0]["prompt_ids"] + log[0]["output_ids"]
    assert whole(second) == log[2]["prompt_ids"] + log[2]["output_ids"]
    assert "rewritten" in trajectory["drift_events"][0]["reason"]


def test_a_text_agent_appending_the_completion_without_the_end_of_turn_token_continues(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            prompt = "E2E-TEXT The story:"
            first = (await h.client.post("/v1/completions", json={"prompt": prompt, "echo": True})).json()
            text = first["choices"][0]["text"]  # echo: the prompt, then the completion
            assert text.startswith(prompt) and len(text) > len(prompt)
            assert "<|im_end|>" not in text  # the text leaves out the end-of-turn token the model ended on
            refused = await h.client.post("/v1/completions", json={"prompt": "x", "echo": True, "logprobs": 1})
            assert refused.status_code == 400 and "echo" in refused.json()["error"]["message"]
            await h.client.post("/v1/completions", json={"prompt": text + " And then"})
            return h.session.segmented_trajectory(), h.endpoint.summary()

    trajectory, summary = asyncio.run(main())
    log = log_of(backend)
    assert trajectory["drift_events"] == [] and summary["segments"] == 1 and len(log) == 2
    # the end-of-turn token stays where the model generated it; only the appended text is new
    assert log[1]["prompt_ids"][:len(log[0]["prompt_ids"]) + len(log[0]["output_ids"])] == \
        log[0]["prompt_ids"] + log[0]["output_ids"]
    assert whole(trajectory) == log[1]["prompt_ids"] + log[1]["output_ids"]
    assert [turn["segment"] for turn in trajectory["turns"]] == [0, 0]  # the first segment's turns say it too
