"""The Anthropic Messages and OpenAI Responses translations of the per-job endpoint, without a
server: requests to chat messages, replies to blocks/items and back, and the streams' events."""
from __future__ import annotations

import json

import pytest

from prorl_celery.endpoint import anthropic_messages as am
from prorl_celery.endpoint import responses_api as ra
from prorl_celery.endpoint.history import EndpointRequestError, Message, Reply

RAW = ("<think>\nCheck first.\n</think>\n\nLooking.\n"
       "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>")


def reply(raw: str = RAW, **options) -> Reply:
    return Reply.parse(raw, tools_given=True, finish=options.pop("finish", "stop"), **options)


# -- Anthropic Messages -------------------------------------------------------------------------------

def test_anthropic_request_becomes_chat_messages_in_block_order():
    body = {"system": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Looking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                           "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                                     {"type": "text", "text": "also this"}]}]}
    messages = am.to_messages(body)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[0].content == "A.\n\nB."
    assistant = messages[2]
    assert (assistant.content, assistant.reasoning) == ("Looking.", "hm")
    assert assistant.tool_calls == (("Bash", json.dumps({"command": "ls"})),)
    assert (messages[3].content, messages[3].tool_call_id) == ("a.txt", "toolu_1")


def test_claude_codes_attribution_block_is_not_part_of_the_system_prompt():
    def system(cch: str) -> list:
        return am.to_messages({"system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.90.a1b; cch={cch};"},
            {"type": "text", "text": "You are Claude Code."}], "messages": [{"role": "user", "content": "hi"}]})
    first, second = system("97bd6"), system("24c2d")  # a new hash on every request
    assert first[0].content == second[0].content == "You are Claude Code."


def test_anthropic_refuses_what_the_policy_cannot_do():
    with pytest.raises(EndpointRequestError, match="image"):
        am.to_messages({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})
    with pytest.raises(EndpointRequestError, match="web_search_20250305"):
        am.to_tools([{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(EndpointRequestError, match="non-empty"):
        am.to_messages({"messages": []})
    [tool] = am.to_tools([{"name": "Bash", "input_schema": {"type": "object"}, "cache_control": {}}])
    assert tool == {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
    assert am.parse({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "T"}],
                     "tool_choice": {"type": "none"}}).parse_tools is False


def test_anthropic_answer_round_trips_to_the_turn_it_was():
    served = reply()
    blocks = am.content_blocks(served)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert am.stop_reason(served) == "tool_use"
    sent_back = am.to_messages({"messages": [{"role": "user", "content": "go"},
                                             {"role": "assistant", "content": blocks}]})[1]
    assert served.accepts(sent_back)
    edited = [dict(b) for b in blocks]
    edited[2]["input"] = {"command": "rm -rf /"}
    assert not served.accepts(am.to_messages({"messages": [{"role": "assistant", "content": edited}]})[0])


def test_anthropic_stream_is_the_documented_event_sequence():
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": am.content_blocks(reply()), "stop_reason": "tool_use", "stop_sequence": None,
               "usage": {"input_tokens": 10, "output_tokens": 7}}
    events = am.stream_events(message)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 10
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] == 7
    assert json.loads(events[10][1]["delta"]["partial_json"]) == {"command": "ls"}


def test_stop_sequences_cut_the_text_and_are_reported():
    cut = reply("The answer is 42. END more", stop=["END", "more"])
    assert (cut.content, cut.stop_sequence, am.stop_reason(cut)) == ("The answer is 42. ", "END", "stop_sequence")
    assert cut.accepts(Message(role="assistant", content="The answer is 42. "))
    assert reply("no stop here", stop=["END"]).stop_sequence is None
    assert am.stop_reason(reply("long", finish="length")) == "max_tokens"
    assert am.error_body(403, "no")["error"]["type"] == "permission_error"


# -- OpenAI Responses ---------------------------------------------------------------------------------

def test_responses_items_become_chat_messages_one_assistant_turn_per_run():
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "perm"}]},
             {"role": "user", "content": "fix it"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
             {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"command\": [\"ls\"]}"},
             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
             {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
             {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]}]
    messages = ra.to_messages(items, "You are Codex.")
    assert [m.role for m in messages] == ["system", "system", "user", "assistant", "tool", "tool"]
    assistant = messages[3]
    assert (assistant.content, assistant.reasoning) == ("Looking.", "hm")
    assert [name for name, _ in assistant.tool_calls] == ["shell", "apply_patch"]
    assert json.loads(assistant.tool_calls[1][1]) == {"input": "*** Begin Patch"}
    assert (messages[5].content, messages[5].tool_call_id) == ("ok", "c2")
    with pytest.raises(EndpointRequestError, match="local_shell_call"):
        ra.to_messages([{"type": "local_shell_call", "call_id": "x"}], None)


def test_responses_tools_custom_as_one_string_hosted_dropped_local_shell_refused():
    tools, custom, dropped = ra.to_tools([
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar"}},
        {"type": "web_search", "external_web_access": False}])
    assert [t["function"]["name"] for t in tools] == ["shell", "apply_patch"]
    assert tools[1]["function"]["parameters"]["required"] == ["input"]
    assert custom == {"apply_patch"} and dropped == {"tools.web_search"}
    with pytest.raises(EndpointRequestError, match="local_shell"):
        ra.to_tools([{"type": "local_shell"}])


def test_responses_output_round_trips_and_custom_calls_keep_their_input():
    raw = ("<think>\nhm\n</think>\n\nPatching.\n<tool_call>\n"
           + json.dumps({"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}) + "\n</tool_call>")
    served = reply(raw)
    items = ra.output_items(served, frozenset({"apply_patch"}))
    assert [i["type"] for i in items] == ["reasoning", "message", "custom_tool_call"]
    assert items[2]["input"] == "*** Begin Patch"
    [back] = ra.to_messages(items, None)
    assert served.accepts(back)


def test_responses_stream_events_are_numbered_and_end_incomplete_when_cut():
    served = reply(RAW, finish="length")
    done = {"id": "resp_1", "status": "incomplete", "output": ra.output_items(served), "usage": {}}
    events = ra.stream_events(done)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.incomplete"
    assert names.count("response.output_item.added") == names.count("response.output_item.done") == 3
    assert {"response.reasoning_text.delta", "response.output_text.delta",
            "response.function_call_arguments.delta"} <= set(names)
    assert all(item["status"] == "incomplete" for item in done["output"][:2])


def test_response_store_chains_and_forgets_the_oldest():
    store = ra.ResponseStore(size=2)
    for n in range(3):
        said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"said {n}"}]}
        store.put({"id": f"resp_{n}", "output": [said]}, [{"role": "user", "content": str(n)}])
    assert store.history("resp_2") == [{"role": "user", "content": "2"}, said]
    with pytest.raises(EndpointRequestError, match="resp_0"):
        store.history("resp_0")
    request = ra.parse({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}],
                        "previous_response_id": "resp_1"}, store)
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"] and len(request.items) == 3
    assert request.messages[1].content == "said 1"


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_incremental_decode_of_growing_ids_is_the_whole_decode(name: str, qwen3_tokenizer: str,
                                                               llama3_tokenizer: str):
    import random

    from prorl_celery.endpoint.history import ChatMatcher
    from prorl_celery.llm.tokenizer import load_tokenizer

    tok = load_tokenizer(qwen3_tokenizer if name == "qwen3" else llama3_tokenizer)
    ids = tok.encode("héllo wörld 你好世界 <|im_end|> 😀😀 tabs\t\t and   spaces\n\n" * 30)
    rng = random.Random(1)
    for _ in range(100):
        matcher = ChatMatcher(tok)
        for cut in sorted(rng.sample(range(1, len(ids)), 4)) + [len(ids)]:  # cuts inside characters too
            assert matcher.decoded(ids[:cut]) == tok.decode(ids[:cut], False)
    matcher.decoded(ids)
    assert matcher.decoded(ids[:5] + [0] * 20) == tok.decode(ids[:5] + [0] * 20, False)  # not an extension


def test_a_stream_that_started_early_numbers_on_and_does_not_announce_twice():
    started = ra.pending("resp_1", {"model": "gpt-5-codex", "input": "x"}, "policy")
    assert (started["id"], started["status"], started["model"]) == ("resp_1", "in_progress", "gpt-5-codex")
    first = ra.keepalive_events(started, first=True, number=0)
    again = ra.keepalive_events(started, first=False, number=2)
    assert [name for name, _ in first + again] == ["response.created", "response.in_progress",
                                                   "response.in_progress"]
    done = {"id": "resp_1", "status": "completed", "output": ra.output_items(reply("Hello.")), "usage": {}}
    rest = ra.stream_events(done, skip_start=True, first_number=3)
    assert "response.created" not in [name for name, _ in rest]
    numbers = [data["sequence_number"] for _, data in first + again + rest]
    assert numbers == list(range(len(numbers)))
    name, failed = ra.failed_event(started, "job_ended", "closed", 3)
    assert name == "response.failed" and failed["response"]["error"] == {"code": "job_ended", "message": "closed"}
