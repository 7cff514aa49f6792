"""Anthropic Messages and OpenAI Responses on the per-job endpoint, driven by the official
``anthropic`` SDK and the ``openai`` SDK's ``client.responses``: a real Unix-socket HTTP server on
a TokenSession whose backend is the scripted vLLM-protocol server (real Qwen3 token ids).

Every test checks the trajectory's ids against what the backend saw and produced (its ``/_log``)."""
from __future__ import annotations

import asyncio
import json

import pytest

from handlers.tool_calls import tool_call
from tests.support.endpoint import KEY, Harness, check_exact, log_of

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")



RULES = [
    {"match": "CC-TOOLS", "scope": "prompt", "replies": [
        "<think>\nList the files first.\n</think>\n\nListing first.\n" + tool_call("Bash", command="ls"),
        tool_call("Read", file_path="a.txt"), "All done: a.txt says hello."]},
    {"match": "CC-STOP", "scope": "prompt", "replies": ["The answer is 42. END and more words after it."]},
    {"match": "SLOW-TURN", "scope": "prompt", "replies": ["Thought about it for a while."], "delay_s": 1.0},
    {"match": "STUCK-TURN", "scope": "prompt", "replies": ["never"], "delay_s": 60},
    {"match": "CX-TOOLS", "scope": "prompt", "replies": [
        "I will look.\n" + tool_call("shell", command=["ls"]),
        tool_call("apply_patch", input="*** Begin Patch\n*** End Patch"),
        "Patched."]},
]
CC_SYSTEM = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
             {"type": "text", "text": "You help with software tasks. " * 40, "cache_control": {"type": "ephemeral"}}]
CC_TOOLS = [
    {"name": "Bash", "description": "Run a shell command", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]
CX_TOOLS = [
    {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False, "parameters": {
        "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"]}},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "web_search"}]


@pytest.fixture
def backend(scripted_llm_server):
    return scripted_llm_server(RULES)


@pytest.fixture
def tok(qwen3_tokenizer) -> str:
    return qwen3_tokenizer


def claude(h: Harness, key: str = KEY):
    import httpx2  # the anthropic SDK's own HTTP client package
    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(h.socket)), timeout=60)
    return anthropic.AsyncAnthropic(base_url="http://endpoint", api_key=key, http_client=http, max_retries=0)


def codex(h: Harness):
    return openai.AsyncOpenAI(base_url="http://endpoint/v1", api_key=KEY, http_client=h.client_with(None),
                              max_retries=0)


def as_param(blocks) -> list[dict]:
    """Content blocks of a reply as the next request sends them back (as Claude Code does)."""
    return [block.model_dump(exclude_none=True) for block in blocks]


def test_anthropic_sdk_tool_use_is_token_exact(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            client = claude(h)
            messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>ok</system-reminder>"},
                                                     {"type": "text", "text": "CC-TOOLS list and read"}]}]
            request = {"model": "claude-sonnet-4-5", "system": CC_SYSTEM, "tools": CC_TOOLS, "max_tokens": 200,
                       "metadata": {"user_id": "u"}, "extra_body": {"temperature": 1.0}}
            counted = await client.messages.count_tokens(model="claude-sonnet-4-5", system=CC_SYSTEM,
                                                         tools=CC_TOOLS, messages=messages)
            listed = [model async for model in client.models.list()]  # Claude Code's model discovery
            assert [m.id for m in listed] == ["policy"] and listed[0].type == "model"

            def attributed(cch: str) -> list:  # Claude Code's first system block, new on every request
                return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.90.a1b; cch={cch};"},
                        *CC_SYSTEM]
            request["system"] = attributed("97bd6")
            first = await client.messages.create(messages=messages, **request)
            assert first.usage.input_tokens == counted.input_tokens  # count_tokens is the template's count
            assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
            assert first.stop_reason == "tool_use" and first.model == "claude-sonnet-4-5"
            thinking, text, use = first.content
            assert thinking.thinking == "List the files first." and text.text == "Listing first."
            assert use.name == "Bash" and use.input == {"command": "ls"} and use.id.startswith("toolu_")
            assert first.usage.output_tokens == len(log_of(backend)[0]["output_ids"])
            messages += [{"role": "assistant", "content": as_param(first.content)},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": "a.txt\n"}]}]
            request["system"] = attributed("24c2d")
            second = await client.messages.create(messages=messages, **request)
            [use2] = second.content
            assert (use2.name, use2.input) == ("Read", {"file_path": "a.txt"})
            messages += [{"role": "assistant", "content": as_param(second.content)},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": use2.id,
                              "content": [{"type": "text", "text": "hello"}]},
                             {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]}]
            third = await client.messages.create(messages=messages, **request)
            assert third.stop_reason == "end_turn" and third.content[0].text == "All done: a.txt says hello."
            return h.session.segmented_trajectory(), h.endpoint.summary()

    trajectory, summary = asyncio.run(main())
    log = log_of(backend)
    # the user text after the last tool result is a new query: Qwen3's template then drops the
    # first turn's <think> block, so the ids served are not what it renders: a drift, said why
    [event] = trajectory["drift_events"]
    assert (event["call"], event["message"]) == (3, 2) and "<think>" in event["reason"]
    assert len(log) == 3 and summary["segments"] == 2
    check_exact(trajectory, log)
    assert "temperature" in summary["ignored_request_params"]
    assert "metadata" not in summary["ignored_request_params"]
    assert {entry["model"] for entry in summary["calls_log"]} == {"claude-sonnet-4-5"}


def test_anthropic_streaming_event_sequence_and_stop_sequences(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            client = claude(h)
            messages = [{"role": "user", "content": "CC-TOOLS stream it"}]
            stream = await client.messages.create(model="claude-sonnet-4-5", system="Be brief.", tools=CC_TOOLS,
                                                  messages=messages, max_tokens=200, stream=True)
            events = [event async for event in stream]
            kinds = [e.type for e in events]
            # (the SDK drops the ping the endpoint sends after the first content_block_start)
            assert kinds == ["message_start", "content_block_start",
                             "content_block_delta", "content_block_delta", "content_block_stop",  # thinking
                             "content_block_start", "content_block_delta", "content_block_stop",  # text
                             "content_block_start", "content_block_delta", "content_block_stop",  # tool_use
                             "message_delta", "message_stop"]
            deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
            assert deltas == ["thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
            assert events[-2].delta.stop_reason == "tool_use"
            # the SDK's accumulating stream builds the same message back
            tool_use = json.loads(events[9].delta.partial_json)
            assert tool_use == {"command": "ls"}
            tool_id = events[8].content_block.id
            messages += [{"role": "assistant", "content": [
                {"type": "thinking", "thinking": events[2].delta.thinking, "signature": events[3].delta.signature},
                {"type": "text", "text": events[6].delta.text},
                {"type": "tool_use", "id": tool_id, "name": "Bash", "input": tool_use}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "a.txt"}]}]
            async with client.messages.stream(model="claude-sonnet-4-5", system="Be brief.", tools=CC_TOOLS,
                                              messages=messages, max_tokens=200) as accumulating:
                second = await accumulating.get_final_message()
            assert second.content[0].input == {"file_path": "a.txt"}
            cut = await client.messages.create(model="claude-haiku-4-5", max_tokens=50, stop_sequences=["END"],
                                               messages=[{"role": "user", "content": "CC-STOP what is it?"}])
            return h.session.segmented_trajectory(), cut, h.endpoint.summary()

    trajectory, cut, summary = asyncio.run(main())
    assert (cut.stop_reason, cut.stop_sequence, cut.content[0].text) == ("stop_sequence", "END", "The answer is 42. ")
    # another model name (a small model's call) is a training sample of its own, no drift: the
    # main agent's conversation is the first one's model (no handler configured the names here)
    assert trajectory["drift_events"] == [] and summary["calls_log"][-1]["model"] == "claude-haiku-4-5"
    assert [(s["origin"], s["model"]) for s in trajectory["samples"]] == [
        ("main", "claude-sonnet-4-5"), ("auxiliary", "claude-haiku-4-5")]
    check_exact(trajectory, log_of(backend))


def test_anthropic_history_rewrite_drifts_and_errors_are_anthropic_shaped(backend, tok):
    async def main():
        async with Harness(backend, tok, max_calls=3) as h:
            client = claude(h)
            request = {"model": "claude-sonnet-4-5", "tools": CC_TOOLS, "max_tokens": 100}
            messages = [{"role": "user", "content": "CC-TOOLS go"}]
            first = await client.messages.create(system="You run commands.", messages=messages, **request)
            use = first.content[-1]
            messages += [{"role": "assistant", "content": as_param(first.content)},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": "a.txt"}]}]
            await client.messages.create(system="You run commands carefully.", messages=messages, **request)
            with pytest.raises(anthropic.AuthenticationError) as denied:
                await claude(h, "wrong-key").messages.create(messages=messages, **request)
            assert denied.value.body["error"]["type"] == "authentication_error"
            with pytest.raises(anthropic.BadRequestError) as bad:
                await client.messages.create(messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}],
                    **request)
            assert "image" in bad.value.message
            await client.messages.create(system="You run commands carefully.", messages=messages, **request)
            async with h.client_with(None) as raw:  # Claude Code's own calls: beta paths, x-api-key, a probe
                counted = await raw.post("/v1/messages/count_tokens?beta=true", json={"messages": messages},
                                         headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                                                  "anthropic-beta": "claude-code-20250219"})
                assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
                assert (await raw.head("/")).status_code == 200
                missing = await raw.post("/v1/messages/batches", headers={"x-api-key": KEY}, json={})
                assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
            with pytest.raises(anthropic.PermissionDeniedError) as limit:
                await client.messages.create(system="x", messages=messages, **request)
            assert "max_iterations" in limit.value.message
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    event = trajectory["drift_events"][0]
    assert event["message"] == 0 and "rewritten" in event["reason"] and event["drifted_tokens"] > 0
    check_exact(trajectory, log)


def test_a_full_context_is_refused_in_anthropics_words(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            h.session.max_model_len = 40
            with pytest.raises(anthropic.BadRequestError) as full:  # Claude Code compacts on these words
                await claude(h).messages.create(model="claude-sonnet-4-5", max_tokens=100,
                                                messages=[{"role": "user", "content": "CC-TOOLS " * 30}])
            return full.value.body["error"]

    error = asyncio.run(main())
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long:") and "tokens > 40 maximum" in error["message"]
    assert log_of(backend) == []


def test_responses_codex_style_full_history_is_token_exact(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            client = codex(h)
            items: list = [{"type": "message", "role": "developer",
                            "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}]},
                           {"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "CX-TOOLS fix the bug"}]}]
            common = {"model": "gpt-5-codex", "instructions": "You are Codex.", "tools": CX_TOOLS, "store": False,
                      "tool_choice": "auto", "parallel_tool_calls": False, "include": ["reasoning.encrypted_content"],
                      "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "thread-1"}
            first = await client.responses.create(input=items, **common)
            assert [o.type for o in first.output] == ["message", "function_call"]
            assert first.output_text == "I will look." and first.status == "completed"
            fc = first.output[1]
            assert fc.name == "shell" and json.loads(fc.arguments) == {"command": ["ls"]}
            items += [o.model_dump(exclude_none=True) for o in first.output]
            items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "a.py"})
            second = await client.responses.create(input=items, **common)
            [patch] = second.output
            assert patch.type == "custom_tool_call" and patch.input == "*** Begin Patch\n*** End Patch"
            items += [o.model_dump(exclude_none=True) for o in second.output]
            items.append({"type": "custom_tool_call_output", "call_id": patch.call_id, "output": "Done!"})
            third = await client.responses.create(input=items, **common)
            assert third.output_text == "Patched."
            assert third.usage.output_tokens == len(log_of(backend)[2]["output_ids"])
            return h.session.segmented_trajectory(), h.endpoint.summary()

    trajectory, summary = asyncio.run(main())
    log = log_of(backend)
    assert len(log) == 3 and trajectory["drift_events"] == []
    check_exact(trajectory, log)
    assert {"reasoning", "tools.web_search"} <= set(summary["ignored_request_params"])
    assert not {"include", "prompt_cache_key", "parallel_tool_calls"} & set(summary["ignored_request_params"])


def test_responses_streaming_chained_by_previous_response_id(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            client = codex(h)
            tools = CX_TOOLS[:2]
            stream = await client.responses.create(model="policy", instructions="You are Codex.", tools=tools,
                                                   input="CX-TOOLS stream", stream=True)
            events = [event async for event in stream]
            kinds = [e.type for e in events]
            assert kinds == ["response.created", "response.in_progress",
                             "response.output_item.added", "response.content_part.added",
                             "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                             "response.output_item.done",
                             "response.output_item.added", "response.function_call_arguments.delta",
                             "response.function_call_arguments.done", "response.output_item.done",
                             "response.completed"]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            done = events[-1].response
            call_id = done.output[1].call_id
            # instructions are not carried over by previous_response_id: the agent sends them again
            second = await client.responses.create(model="policy", instructions="You are Codex.", tools=tools,
                                                   previous_response_id=done.id, input=[
                                                       {"type": "function_call_output", "call_id": call_id,
                                                        "output": "a.py"}])
            stored = await client.responses.retrieve(second.id)
            assert stored.id == second.id
            stream = await client.responses.create(
                model="policy", instructions="You are Codex.", tools=tools, previous_response_id=second.id, stream=True,
                input=[{"type": "custom_tool_call_output", "call_id": second.output[0].call_id, "output": "ok"}])
            last = [event async for event in stream][-1].response
            assert last.output_text == "Patched."
            with pytest.raises(openai.BadRequestError):
                await client.responses.create(model="policy", previous_response_id="resp_unknown", input="x")
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    log = log_of(backend)
    assert len(log) == 3 and trajectory["drift_events"] == []
    check_exact(trajectory, log)


def test_responses_rewritten_history_drifts(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            client = codex(h)
            items: list = [{"role": "user", "content": "CX-TOOLS go"}]
            first = await client.responses.create(model="policy", instructions="A.", tools=CX_TOOLS[:2], input=items,
                                                  store=False)
            items += [o.model_dump(exclude_none=True) for o in first.output]
            items.append({"type": "function_call_output", "call_id": first.output[1].call_id, "output": "a.py"})
            await client.responses.create(model="policy", instructions="B.", tools=CX_TOOLS[:2], input=items)
            return h.session.segmented_trajectory()

    trajectory = asyncio.run(main())
    [event] = trajectory["drift_events"]
    assert event["message"] == 0 and "rewritten" in event["reason"]
    check_exact(trajectory, log_of(backend))


def test_a_long_turn_streams_keepalives_and_a_late_refusal_is_an_error_event(backend, tok):
    async def main():
        async with Harness(backend, tok) as h:
            h.endpoint.keepalive_s = 0.25  # the turns below take 1 s: the streams start before they are done
            raw = [line async for line in (await h.client.send(h.client.build_request(
                "POST", "/v1/messages", json={"model": "m", "max_tokens": 50, "stream": True,
                                             "messages": [{"role": "user", "content": "SLOW-TURN a"}]}),
                stream=True)).aiter_lines() if line.startswith("event:")]
            assert raw[0] == "event: ping" and raw.count("event: ping") >= 3 and raw[-1] == "event: message_stop"
            async with claude(h).messages.stream(model="m", max_tokens=50, messages=[
                    {"role": "user", "content": "SLOW-TURN a"},
                    {"role": "assistant", "content": "Thought about it for a while."},
                    {"role": "user", "content": "SLOW-TURN b"}]) as stream:
                message = await stream.get_final_message()
            assert message.content[0].text == "Thought about it for a while."
            events = [e async for e in await codex(h).responses.create(model="m", input="SLOW-TURN c", stream=True)]
            kinds = [e.type for e in events]
            assert kinds[:3] == ["response.created", "response.in_progress", "response.in_progress"]
            assert kinds[-1] == "response.completed" and kinds.count("response.created") == 1
            assert [e.sequence_number for e in events] == list(range(len(events)))
            assert events[-1].response.id == events[0].response.id
            # a call refused once its stream has started (the job ended): an error event, not a status
            stuck = asyncio.ensure_future(claude(h).messages.create(
                model="m", max_tokens=50, stream=True, messages=[{"role": "user", "content": "STUCK-TURN"}]))
            await asyncio.sleep(1.0)
            h.endpoint.close("the job was cancelled")
            with pytest.raises(anthropic.APIStatusError) as refused:
                async for _ in await stuck:
                    pass
            return refused.value

    refused = asyncio.run(main())
    assert "job" in str(refused.body) and refused.body["error"]["type"] == "permission_error"
