"""Random chat conversations for the tokenizer tests: system or not, user and assistant turns, tool
calls and tool messages, <think> blocks and reasoning fields, unicode and special-token text."""
from __future__ import annotations

import json
import random

PIECES = ["Hello", "What is 2 + 3?", "  leading and trailing spaces  ", "line one\nline two\n\n", "tabs\tand\r\n",
          "héllo wörld", "日本語のテキスト", "中文，标点。", "emoji 🙂🚀👩‍👩‍👧", "Ελληνικά", "עברית ומספרים 123",
          "zero\u200bwidth", "combining e\u0301", "<think>\nreasoning here\n</think>\n\nThe answer", "\\boxed{42}",
          "<|im_end|> inside text", "<|eot_id|> and <|begin_of_text|>", "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
          "```python\nprint('hi')\n```", "{\"json\": [1, 2, {\"a\": null}]}", "", " ", "\n", "a" * 300,
          "mixed 日本 and emoji 🎉 and \u00a0nbsp", "'quotes' \"double\" `back`", "n't 's 're ,.!?"]
TOOLS = [
    {"type": "function", "function": {"name": "python", "description": "Run Python code.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
    {"type": "function", "function": {"name": "search", "description": "Søg i korpus 🔍",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "k": {"type": "integer", "default": 3}}}}},
]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))


def _tool_call(rng: random.Random, index: int) -> dict:
    arguments: object = ({"code": random_text(rng)} if rng.random() < 0.5
                         else {"query": random_text(rng), "k": rng.randint(1, 9)})
    if rng.random() < 0.3:
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": rng.choice(["python", "search"]), "arguments": arguments}}


def conversations(count: int, seed: int, single_tool_call: bool) -> list[tuple[list[dict], list[dict] | None]]:
    """Random conversations: system or not, user/assistant turns, assistant tool calls followed by
    tool messages, <think> in content or reasoning_content, keys set to None."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        messages: list[dict] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": random_text(rng)})
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": random_text(rng)})
            if rng.random() < 0.2 and turn:
                break  # ends on a user turn
            assistant: dict = {"role": "assistant", "content": random_text(rng)}
            if rng.random() < 0.3:
                assistant["content"] = f"<think>\n{random_text(rng)}\n</think>\n\n{assistant['content']}"
            if rng.random() < 0.2:
                assistant["reasoning_content"] = random_text(rng)
            if rng.random() < 0.2:
                assistant["tool_calls"] = None  # dropped, as transformers drops None values
            calls = []
            if rng.random() < 0.4:
                calls = [_tool_call(rng, i) for i in range(1 if single_tool_call else rng.randint(1, 3))]
                assistant["tool_calls"] = calls
                if rng.random() < 0.3:
                    assistant["content"] = ""
            messages.append(assistant)
            for call in calls:
                tool = {"role": "tool", "content": random_text(rng), "tool_call_id": call["id"]}
                if rng.random() < 0.3:
                    tool["name"] = call["function"]["name"]
                messages.append(tool)
            if calls and rng.random() < 0.5:
                messages.append({"role": "assistant", "content": random_text(rng)})
        tools = rng.choice([None, TOOLS, TOOLS[:1]])
        out.append((messages, tools))
    return out


def render_or_error(render, messages, tools, add_generation_prompt):
    try:
        return render(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as error:  # noqa: BLE001 - both must refuse alike
        return f"<error {type(error).__name__}: {error}>"
