"""Parsing Hermes/Qwen tool calls out of generated text."""
from handlers.tool_calls import ToolCall, ToolCallError, parse_tool_calls, tool_call


def test_calls_are_parsed_in_order():
    text = ('Let me check.\n<tool_call>\n{"name": "python", "arguments": {"code": "1+1"}}\n</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>')
    assert parse_tool_calls(text) == [ToolCall("python", {"code": "1+1"}), ToolCall("search", {"query": "x"})]


def test_malformed_calls_become_errors_the_agent_can_answer():
    calls = parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": </tool_call>'
                             '<tool_call>["python"]</tool_call><tool_call>{"name": "python"')
    assert [type(c) for c in calls] == [ToolCallError] * 3
    assert "not valid JSON" in calls[0].message and "needs" in calls[1].message


def test_text_without_calls():
    assert parse_tool_calls("The answer is \\boxed{4}.") == []


def test_a_written_call_parses_back():
    text = "Run it.\n" + tool_call("bash", command="printf 'a\\n' | wc -l") + tool_call("finish", answer="1")
    assert parse_tool_calls(text) == [ToolCall("bash", {"command": "printf 'a\\n' | wc -l"}),
                                      ToolCall("finish", {"answer": "1"})]
